//! Build script: records the commit the binary was built from, for
//! `herald --version` and the `herald_build_info` metric. `HERALD_COMMIT`
//! (set by a build without a git checkout, such as a container build)
//! wins; else `git rev-parse --short=12 HEAD`; else `unknown`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=HERALD_COMMIT");
    let commit = std::env::var("HERALD_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| {
            // Built again when HEAD moves: HEAD itself and the ref it names.
            for file in ["HEAD", "logs/HEAD"] {
                // A missing file would make every build run this again.
                if let Some(path) = git(&["rev-parse", "--git-path", file])
                    .filter(|p| std::path::Path::new(p).exists())
                {
                    println!("cargo:rerun-if-changed={path}");
                }
            }
            git(&["rev-parse", "--short=12", "HEAD"])
        })
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=HERALD_COMMIT={commit}");
}
