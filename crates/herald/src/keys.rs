//! `herald keys generate`: a new API key and the config lines that
//! configure it (only its SHA-256 is stored on the server).
//!
//! The key goes to stderr and only the config lines to stdout, so that
//! `herald keys generate >> herald.toml` appends the lines and never the
//! key: the key is shown on the terminal once, and stored nowhere.

use std::io::Write;
use std::process::ExitCode;

use herald_auth::{api_key_sha256, generate_api_key};

/// `herald keys` subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum KeysCommand {
    /// Print a new API key (on stderr) and the `[[auth.api_keys]]` lines
    /// to paste into the config file (on stdout, without the key).
    Generate(GenerateArgs),
}

/// Flags of `herald keys generate`.
#[derive(Debug, clap::Args)]
pub(crate) struct GenerateArgs {
    /// The key's name in the config and in logs.
    #[arg(long, default_value = "backend")]
    name: String,
    /// What the key may do: a comma-separated subset of publish, read,
    /// admin.
    #[arg(long, value_delimiter = ',', default_value = "publish,read")]
    permissions: Vec<PermissionArg>,
    /// Channel patterns the key applies to (`*` matches any run of
    /// characters), comma-separated; every channel when left out.
    #[arg(long, value_delimiter = ',')]
    channels: Vec<String>,
}

/// A permission as the command line spells it.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PermissionArg {
    Publish,
    Read,
    Admin,
}

impl PermissionArg {
    fn as_str(self) -> &'static str {
        match self {
            Self::Publish => "publish",
            Self::Read => "read",
            Self::Admin => "admin",
        }
    }
}

/// Runs a `herald keys` subcommand.
pub(crate) fn run(command: KeysCommand) -> anyhow::Result<ExitCode> {
    let KeysCommand::Generate(args) = command;
    let key = generate_api_key();
    let mut err = std::io::stderr().lock();
    err.write_all(key_notice(&key).as_bytes())?;
    err.flush()?;
    let mut out = std::io::stdout().lock();
    out.write_all(snippet(&args, &key).as_bytes())?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// What `generate` prints on stderr: the key itself.
fn key_notice(key: &str) -> String {
    format!("API key (give it to the backend; it is shown only now):\n{key}\n")
}

/// What `generate` prints on stdout: the TOML lines, which hold the key's
/// SHA-256 and never the key.
fn snippet(args: &GenerateArgs, key: &str) -> String {
    let quote = |s: &str| toml_string(s);
    let permissions: Vec<String> = args.permissions.iter().map(|p| quote(p.as_str())).collect();
    let mut text = format!(
        "[[auth.api_keys]]\n\
         name = {}\n\
         sha256 = {}\n\
         permissions = [{}]\n",
        quote(&args.name),
        quote(&api_key_sha256(key)),
        permissions.join(", "),
    );
    if !args.channels.is_empty() {
        let channels: Vec<String> = args.channels.iter().map(|c| quote(c)).collect();
        text.push_str(&format!("channels = [{}]\n", channels.join(", ")));
    }
    text
}

/// `s` as a TOML basic string (JSON's escapes are valid TOML escapes).
fn toml_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_snippet_configures_the_key() {
        let args = GenerateArgs {
            name: "back\"end".to_owned(),
            permissions: vec![PermissionArg::Publish, PermissionArg::Admin],
            channels: vec!["news:*".to_owned()],
        };
        let text = snippet(&args, "k3y");
        assert!(!text.contains("k3y"), "{text}");
        assert!(key_notice("k3y").ends_with("\nk3y\n"));
        assert!(text.contains(&format!("sha256 = \"{}\"", api_key_sha256("k3y"))));
        assert!(text.contains("permissions = [\"publish\", \"admin\"]"));
        assert!(text.contains("channels = [\"news:*\"]"));
        assert!(text.contains("name = \"back\\\"end\""));
    }

    #[test]
    fn the_printed_lines_configure_a_key_the_server_accepts() {
        let args = GenerateArgs {
            name: "backend".to_owned(),
            permissions: vec![PermissionArg::Publish, PermissionArg::Read],
            channels: vec!["news:*".to_owned(), "a\"b".to_owned()],
        };
        let key = generate_api_key();
        let text = snippet(&args, &key);
        let file: toml::Table = text.parse().unwrap();
        let auth: herald_auth::AuthConfig = file["auth"].clone().try_into().unwrap();
        let config = &auth.api_keys[0];
        assert_eq!(config.name, "backend");
        assert_eq!(config.sha256, api_key_sha256(&key));
        assert_eq!(
            config.permissions,
            [
                herald_auth::Permission::Publish,
                herald_auth::Permission::Read
            ]
        );
        assert_eq!(config.channels.as_deref().unwrap(), ["news:*", "a\"b"]);
        herald_auth::Auth::new(
            &auth,
            &herald_auth::NamespacesConfig::new(),
            std::sync::Arc::new(herald_auth::NoFetch),
        )
        .unwrap();
    }
}
