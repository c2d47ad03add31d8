//! Where the tests find the real client libraries they drive with Node.js:
//! the directory `tests/clients`, named by `HERALD_TEST_NODE_CLIENTS`
//! once `npm ci` installed its packages (`scripts/test` does both).

use std::path::PathBuf;

/// The Node.js test clients' directory, checked to hold the npm
/// `packages` (each `node_modules/<package>/package.json`) and the
/// `scripts` (e.g. `follow.mjs`). Panics, saying what to do, when
/// `HERALD_TEST_NODE_CLIENTS` is not set or names a directory without
/// them: a test that needs a real client never passes without one.
pub fn node_clients(packages: &[&str], scripts: &[&str]) -> PathBuf {
    let Some(dir) = std::env::var_os("HERALD_TEST_NODE_CLIENTS") else {
        panic!(
            "HERALD_TEST_NODE_CLIENTS is not set. It names the directory of the Node.js test \
             clients (tests/clients in the repository) once `npm ci` has installed their \
             packages there; ./scripts/test does both. By hand: \
             `(cd tests/clients && npm ci)`, then \
             `HERALD_TEST_NODE_CLIENTS=$PWD/tests/clients cargo test ...`"
        );
    };
    let dir = PathBuf::from(dir);
    for script in scripts {
        assert!(
            dir.join(script).is_file(),
            "HERALD_TEST_NODE_CLIENTS={} has no {script}: it must name tests/clients",
            dir.display()
        );
    }
    for package in packages {
        assert!(
            dir.join("node_modules")
                .join(package)
                .join("package.json")
                .is_file(),
            "the {package} package is not installed in {}: run `npm ci` there",
            dir.display()
        );
    }
    dir
}

/// The `node` binary that runs the clients: `HERALD_TEST_NODE`, else
/// `node` on `PATH`.
pub fn node_bin() -> PathBuf {
    std::env::var_os("HERALD_TEST_NODE").map_or_else(|| PathBuf::from("node"), PathBuf::from)
}
