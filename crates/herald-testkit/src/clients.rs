//! Where the tests find the real client libraries they drive: with
//! Node.js, the directory `tests/clients`, named by
//! `HERALD_TEST_NODE_CLIENTS` once `npm ci` installed its packages; with
//! Python, the scripts of `tests/clients/python`, run by the Python of a
//! virtualenv with the packages of its `requirements.lock`, named by
//! `HERALD_TEST_PYTHON`; and the Chromium that browser tests run headless,
//! named by `HERALD_TEST_CHROMIUM` (`scripts/test` does all of it).

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

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

/// The Python that runs the Python test clients: `HERALD_TEST_PYTHON`,
/// the interpreter of a virtualenv with exactly the packages of
/// `tests/clients/python/requirements.lock`. Panics, saying what to do,
/// when it is not set.
pub fn python_bin() -> PathBuf {
    let Some(python) = std::env::var_os("HERALD_TEST_PYTHON") else {
        panic!(
            "HERALD_TEST_PYTHON is not set. It names the Python of a virtualenv with the \
             packages of tests/clients/python/requirements.lock; ./scripts/test makes it. \
             By hand: `python3 -m venv tests/clients/python/.venv && \
             tests/clients/python/.venv/bin/pip install --no-deps -r \
             tests/clients/python/requirements.lock`, then \
             `HERALD_TEST_PYTHON=$PWD/tests/clients/python/.venv/bin/python cargo test ...`"
        );
    };
    PathBuf::from(python)
}

/// The Python test client `tests/clients/python/<script>` of this
/// repository.
///
/// # Panics
/// When there is no such file.
pub fn python_script(script: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/clients/python")
        .join(script);
    assert!(path.is_file(), "no Python test client {}", path.display());
    path
}

/// The Chromium binary named by `HERALD_TEST_CHROMIUM`, which the browser
/// tests run headless through `playwright-core`. Panics, saying what to
/// do, when it is not set or names no file.
pub fn chromium_bin() -> PathBuf {
    let Some(path) = std::env::var_os("HERALD_TEST_CHROMIUM") else {
        panic!(
            "HERALD_TEST_CHROMIUM is not set. It names the Chromium binary the browser tests \
             run headless; ./scripts/test installs Debian's `chromium` package when it is \
             missing and sets it. By hand: `apt-get install chromium`, then \
             `HERALD_TEST_CHROMIUM=/usr/bin/chromium cargo test ...`"
        );
    };
    let path = PathBuf::from(path);
    assert!(
        path.is_file(),
        "HERALD_TEST_CHROMIUM={} is not a file: it must name the Chromium binary",
        path.display()
    );
    path
}

/// A test client's process, started by [`ClientProcess::spawn`]: commands
/// go to its stdin, its reports come one per line on its stdout, and what
/// it writes on stderr is kept for failure messages. Dropping it kills the
/// process.
pub struct ClientProcess {
    /// The process.
    pub child: Child,
    /// Its stdin, kept open until [`ClientProcess::close_stdin`] (scripts
    /// end when it closes).
    pub stdin: Option<ChildStdin>,
    /// Its stdout, line by line.
    pub reports: Lines<BufReader<ChildStdout>>,
    stderr: Arc<Mutex<String>>,
}

impl ClientProcess {
    /// Starts `command` with its three streams piped.
    ///
    /// # Panics
    /// When the process cannot start.
    pub fn spawn(mut command: Command) -> Self {
        let program = command.as_std().get_program().to_owned();
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.to_string_lossy()));
        let stdin = child.stdin.take();
        let reports = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stderr.take().expect("piped stderr");
        let sink = stderr.clone();
        tokio::spawn(async move {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text).await;
            sink.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push_str(&text);
        });
        Self {
            child,
            stdin,
            reports,
            stderr,
        }
    }

    /// Writes `line` and a line feed to its stdin.
    ///
    /// # Panics
    /// When the stdin was closed or the write fails.
    pub async fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("the client's stdin is open");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write to the client's stdin");
        stdin.flush().await.expect("flush the client's stdin");
    }

    /// Closes its stdin (a script ends when its stdin ends).
    pub fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    /// What the process wrote on stderr so far.
    pub fn stderr_text(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
