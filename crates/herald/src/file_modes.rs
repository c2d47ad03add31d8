//! Warnings about secret-holding files that other users of the machine
//! can read: the config file (it may hold the cluster secret, the JWT
//! secret, a database password) and the TLS private key.

use std::path::Path;

use tracing::warn;

/// Whether the file at `path` may be read by users other than its owner
/// (its mode grants read to the group or to others); `None` when its
/// mode cannot be read.
pub(crate) fn readable_by_others(path: &Path) -> Option<bool> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode();
    Some(mode & 0o044 != 0)
}

/// Logs a WARN for each of `files` (what it is, where) that users other
/// than its owner may read; returns how many it warned about.
pub(crate) fn warn_readable_by_others(files: &[(&str, &Path)]) -> usize {
    let mut warned = 0;
    for (what, path) in files {
        if readable_by_others(path) == Some(true) {
            warned += 1;
            warn!(
                file = %path.display(),
                what = *what,
                "{what} can be read by other users of this machine and may hold secrets; \
                 make it the owner's only (chmod 600)"
            );
        }
    }
    warned
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn files_readable_by_group_or_others_are_warned_about() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, mode: u32| {
            let path = dir.path().join(name);
            std::fs::write(&path, "secret").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            path
        };
        let private = file("private.toml", 0o600);
        let group = file("group.pem", 0o640);
        let world = file("world.toml", 0o644);
        assert_eq!(readable_by_others(&private), Some(false));
        assert_eq!(readable_by_others(&group), Some(true));
        assert_eq!(readable_by_others(&world), Some(true));
        assert_eq!(readable_by_others(&dir.path().join("absent")), None);
        assert_eq!(
            warn_readable_by_others(&[
                ("the config file", &private),
                ("the TLS key", &group),
                ("the config file", &world),
            ]),
            2
        );
        assert_eq!(warn_readable_by_others(&[("the config file", &private)]), 0);
    }
}
