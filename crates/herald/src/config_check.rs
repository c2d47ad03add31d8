//! `herald config check FILE`: validates a config file as `herald serve
//! --config FILE` would (the same parsing, the same checks, lease timing
//! included, without binding or connecting) and prints the effective
//! settings, each with where it came from, secrets masked as `****`.

use herald_server::{RetentionConfig, RetentionPolicy};
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, FromArgMatches};

use crate::config_file::{self, ConfigFile, FLAG_SECTIONS};
use crate::serve::settings::{self, serve_command, serve_command_line, ServeArgs};

/// What a secret is replaced with.
const MASK: &str = "****";

/// Words that make a key of `[auth]` or `[namespaces]` secret (its string
/// values are masked, and every string under it when it is a table):
/// `sha256` of `[[auth.api_keys]]`, `cluster_secret`, `hs256_secret`. A key
/// such as `api_keys` or `rsa_public_key_pem` is no secret: the names,
/// permissions, channel patterns and key file paths stay visible.
const SECRET_WORDS: [&str; 6] = ["secret", "sha256", "password", "token", "hash", "private"];

/// The default-policy flags of `herald serve` and their keys in
/// `[retention]`: the effective policy shows them over the file's.
const RETENTION_FLAGS: [(&str, &str); 3] = [
    ("retention_max_messages", "max_messages"),
    ("retention_max_age", "max_age"),
    ("retention_max_bytes", "max_bytes"),
];

/// `herald config` subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum ConfigCommand {
    /// Validate a config file and print the effective settings (flags are
    /// not read; `HERALD_*` variables are), secrets masked.
    Check {
        /// The config file (TOML).
        file: PathBuf,
    },
}

/// Runs a `herald config` subcommand: status 0 and the effective settings
/// on stdout when the file is valid.
///
/// # Errors
/// The file is refused: the message names the problem (status 1).
pub(crate) fn run(command: ConfigCommand) -> anyhow::Result<ExitCode> {
    let ConfigCommand::Check { file: path } = command;
    let file = config_file::load(&path, &serve_command())?;
    let matches = serve_command_line()
        .mut_subcommand("serve", |serve| {
            config_file::with_file_defaults(serve, &file)
        })
        .try_get_matches_from([
            OsString::from("herald"),
            OsString::from("serve"),
            OsString::from("--config"),
            path.clone().into_os_string(),
        ])
        .map_err(|e| anyhow::anyhow!("{}", e.to_string().trim()))?;
    let serve_matches = matches
        .subcommand_matches("serve")
        .expect("the serve subcommand was parsed");
    let args = ServeArgs::from_arg_matches(serve_matches)?;
    settings::check(&args, &file)
        .map_err(|e| e.context(format!("config file {}", path.display())))?;
    // The policies as `herald serve` puts them in force: the file's
    // `[retention]` with the default-policy variables over it.
    let retention = args
        .retention
        .load(Some(&path))
        .map_err(|e| e.context(format!("config file {}", path.display())))?;
    let mut out = effective_settings(serve_matches, &file, &retention);
    // Checked by `settings::check` above.
    if let Ok(auth) = herald_auth::Auth::new(
        &file.auth.clone().unwrap_or_default(),
        &file.namespaces.clone().unwrap_or_default(),
        std::sync::Arc::new(herald_auth::NoFetch),
    ) {
        out.push_str(&publish_rates_comment(&auth));
    }
    print!("{out}");
    eprintln!("{}: valid", path.display());
    Ok(ExitCode::SUCCESS)
}

/// The effective settings as a TOML file: each key with its value (secrets
/// masked) and, in a comment, where the value came from; `[retention]` is
/// the effective `retention` (the file's, with the default-policy
/// variables over it).
///
/// Lease timings not set show the value they take from `lease_ttl`.
fn effective_settings(
    matches: &ArgMatches,
    file: &ConfigFile,
    retention: &RetentionConfig,
) -> String {
    let serve = serve_command();
    let mut top = String::new();
    let mut sections: Vec<(&str, String)> =
        FLAG_SECTIONS.iter().map(|s| (*s, String::new())).collect();
    for arg in serve.get_arguments() {
        let Some(key) = config_file::key_for_flag(arg) else {
            continue;
        };
        let id = arg.get_id().as_str();
        let source = match matches.value_source(id) {
            Some(ValueSource::EnvVariable) => format!(
                "environment {}",
                arg.get_env()
                    .map(|e| e.to_string_lossy())
                    .unwrap_or_default()
            ),
            Some(ValueSource::DefaultValue) if file.flags.contains_key(id) => "file".to_owned(),
            Some(ValueSource::DefaultValue) => "default".to_owned(),
            Some(ValueSource::CommandLine) => "command line".to_owned(),
            _ => "not set".to_owned(),
        };
        let values: Vec<String> = matches
            .get_raw(id)
            .map(|raw| raw.map(|v| v.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let values: Vec<String> = values
            .into_iter()
            .map(|v| {
                if id == "database_url" {
                    mask_connection_string(&v)
                } else if arg.is_hide_env_values_set() {
                    MASK.to_owned()
                } else {
                    v
                }
            })
            .collect();
        let (target, name) = match key.split_once('.') {
            Some((section, name)) => (
                &mut sections
                    .iter_mut()
                    .find(|(s, _)| *s == section)
                    .expect("a flag section")
                    .1,
                name.to_owned(),
            ),
            None => (&mut top, key.clone()),
        };
        let many = matches!(arg.get_action(), ArgAction::Append);
        let derived = derived_lease_timing(matches, id);
        let line = match (values.as_slice(), many) {
            ([], _) if derived.is_some() => format!(
                "{name} = {}  # default, derived from lease_ttl",
                toml_string(&derived.unwrap_or_default())
            ),
            ([], _) => format!("# {name} =  # {source}"),
            (values, true) => format!("{name} = {}  # {source}", toml_array(values)),
            ([value, ..], false) => format!("{name} = {}  # {source}", toml_string(value)),
        };
        let _ = writeln!(target, "{line}");
    }
    let mut out = String::from(
        "# Effective settings of herald serve (command line > HERALD_* > file > default)\n",
    );
    out.push_str(&top);
    for (name, body) in sections {
        let _ = write!(out, "\n[{name}]\n{body}");
    }
    // The typed sections as tables; their secrets already serialize
    // masked, and `masked` masks by key name on top.
    let typed = |name: &str, value: Result<toml::Table, toml::ser::Error>| {
        value.unwrap_or_else(|e| {
            let mut table = toml::Table::new();
            table.insert(
                "error".to_owned(),
                toml::Value::String(format!("[{name}] cannot be shown: {e}")),
            );
            table
        })
    };
    let auth = file
        .auth
        .as_ref()
        .map(|a| typed("auth", toml::Table::try_from(a)));
    let namespaces = file
        .namespaces
        .as_ref()
        .map(|n| typed("namespaces", toml::Table::try_from(n)));
    for (name, table) in [("auth", &auth), ("namespaces", &namespaces)] {
        if let Some(table) = table {
            let mut wrapper = toml::Table::new();
            wrapper.insert(name.to_owned(), toml::Value::Table(masked(table, false)));
            let _ = write!(
                out,
                "\n{}",
                toml::to_string(&wrapper).unwrap_or_else(|e| format!("# [{name}]: {e}\n"))
            );
        }
    }
    if file.retention.is_some() || !retention.is_unbounded() {
        let _ = write!(out, "\n{}", retention_section(matches, retention));
    }
    out
}

/// The publish rates in force, per node, as TOML comments (defaults
/// included, which the `[auth]` table above does not show).
fn publish_rates_comment(auth: &herald_auth::Auth) -> String {
    let mut out = String::from("\n# Publish rates in force (each node counts its own):\n");
    for line in auth.publish_rates() {
        let _ = writeln!(out, "#   {line}");
    }
    out
}

/// The effective `[retention]` section as the file spells it, with a
/// comment naming each default-policy bound that an environment variable
/// (or flag) set over the file.
fn retention_section(matches: &ArgMatches, retention: &RetentionConfig) -> String {
    let serve = serve_command();
    let mut out = String::new();
    for (id, key) in RETENTION_FLAGS {
        let source = match matches.value_source(id) {
            Some(ValueSource::EnvVariable) => serve
                .get_arguments()
                .find(|a| a.get_id() == id)
                .and_then(|a| a.get_env())
                .map(|e| format!("environment {}", e.to_string_lossy())),
            Some(ValueSource::CommandLine) => Some("command line".to_owned()),
            _ => None,
        };
        if let Some(source) = source {
            let _ = writeln!(out, "# retention.{key} from the {source}, over the file");
        }
    }
    let mut wrapper = toml::Table::new();
    wrapper.insert(
        "retention".to_owned(),
        toml::Value::Table(retention_table(retention)),
    );
    match toml::to_string(&wrapper) {
        Ok(text) if text.trim().is_empty() => out.push_str("[retention]\n"),
        Ok(text) => out.push_str(&text),
        Err(e) => {
            let _ = writeln!(out, "# [retention]: {e}");
        }
    }
    out
}

/// The `[retention]` section as the file spells it: the default policy's
/// bounds, then `namespaces.<name>`.
fn retention_table(retention: &RetentionConfig) -> toml::Table {
    let policy = |p: &RetentionPolicy| {
        let mut table = toml::Table::new();
        let count = |n: u64| toml::Value::Integer(i64::try_from(n).unwrap_or(i64::MAX));
        if let Some(n) = p.max_messages {
            table.insert("max_messages".to_owned(), count(n));
        }
        if let Some(age) = p.max_age {
            table.insert(
                "max_age".to_owned(),
                toml::Value::String(herald_server::duration_text(age)),
            );
        }
        if let Some(n) = p.max_bytes {
            table.insert("max_bytes".to_owned(), count(n));
        }
        table
    };
    let mut table = policy(&retention.default);
    if !retention.namespaces.is_empty() {
        let namespaces = retention
            .namespaces
            .iter()
            .map(|(name, p)| (name.clone(), toml::Value::Table(policy(p))))
            .collect();
        table.insert("namespaces".to_owned(), toml::Value::Table(namespaces));
    }
    table
}

/// A value as TOML: an integer or a boolean bare, anything else as a basic
/// string (the file accepts both forms for every key).
fn toml_string(s: &str) -> String {
    if s.parse::<i64>().is_ok() || s == "true" || s == "false" {
        return s.to_owned();
    }
    toml::Value::String(s.to_owned()).to_string()
}

/// A TOML array of strings.
fn toml_array(values: &[String]) -> String {
    toml::Value::Array(values.iter().cloned().map(toml::Value::String).collect()).to_string()
}

/// `table` with the strings under secret keys (and every string, with
/// `secret` set) replaced by [`MASK`]. Whether a key is secret is decided
/// by its own name ([`SECRET_WORDS`]) or a secret table around it, never
/// by a table or array of tables it is in that is not secret itself.
fn masked(table: &toml::Table, secret: bool) -> toml::Table {
    table
        .iter()
        .map(|(key, value)| {
            let lower = key.to_ascii_lowercase();
            let secret = secret || SECRET_WORDS.iter().any(|w| lower.contains(w));
            (key.clone(), masked_value(value, secret))
        })
        .collect()
}

/// `value` with its strings masked when `secret`.
fn masked_value(value: &toml::Value, secret: bool) -> toml::Value {
    match value {
        toml::Value::String(_) if secret => toml::Value::String(MASK.to_owned()),
        toml::Value::Table(t) => toml::Value::Table(masked(t, secret)),
        toml::Value::Array(items) => {
            toml::Value::Array(items.iter().map(|v| masked_value(v, secret)).collect())
        }
        other => other.clone(),
    }
}

/// A PostgreSQL connection string with its password replaced by
/// [`MASK`]: the password of a `postgres://user:password@host` URL, or
/// of libpq's `password=...` setting (quoted or not).
fn mask_connection_string(s: &str) -> String {
    if s.contains("://") {
        return match reqwest::Url::parse(s) {
            Ok(mut url) if url.password().is_some() => {
                let _ = url.set_password(Some(MASK));
                url.to_string()
            }
            Ok(url) => url.to_string(),
            Err(_) => MASK.to_owned(),
        };
    }
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find("password") {
        let (before, after) = rest.split_at(at + "password".len());
        out.push_str(before);
        let trimmed = after.trim_start();
        let Some(value) = trimmed.strip_prefix('=') else {
            rest = after;
            continue;
        };
        let value = value.trim_start();
        let end = if let Some(quoted) = value.strip_prefix('\'') {
            // A quoted value ends at the first unescaped quote.
            let mut escaped = false;
            let close = quoted
                .char_indices()
                .find(|&(_, c)| {
                    let closes = c == '\'' && !escaped;
                    escaped = c == '\\' && !escaped;
                    closes
                })
                .map_or(quoted.len(), |(i, _)| i + 1);
            1 + close
        } else {
            value.find(char::is_whitespace).unwrap_or(value.len())
        };
        out.push('=');
        out.push_str(MASK);
        rest = &value[end.min(value.len())..];
    }
    out.push_str(rest);
    out
}

/// The value a lease timing flag `id` takes from `--lease-ttl` when it is
/// not set (humantime's syntax, rounded to the millisecond), else `None`.
fn derived_lease_timing(matches: &ArgMatches, id: &str) -> Option<String> {
    let ttl = *matches.get_one::<std::time::Duration>("lease_ttl")?;
    let derived = match id {
        "lease_safety_margin" => herald_lease::default_safety_margin(ttl),
        "renew_statement_timeout" => herald_lease::default_renew_statement_timeout(ttl),
        "lease_renew_interval" => ttl / 6,
        _ => return None,
    };
    let millis = std::time::Duration::from_millis(derived.as_millis() as u64);
    Some(humantime::format_duration(millis).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_passwords_are_masked_in_both_forms() {
        assert_eq!(
            mask_connection_string("postgres://herald:s3cret@db:5432/herald"),
            "postgres://herald:****@db:5432/herald"
        );
        assert_eq!(
            mask_connection_string("host=db password=s3cret user=herald"),
            "host=db password=**** user=herald"
        );
        assert_eq!(
            mask_connection_string("host=db password = 'a b\\' c' user=h"),
            "host=db password=**** user=h"
        );
        assert_eq!(mask_connection_string("host=db"), "host=db");
    }

    #[test]
    fn secret_keys_are_masked_in_opaque_sections() {
        let table: toml::Table = r#"
cluster_secret = "first-secret-value"
[jwt]
hs256_secret = "second-secret-value"
[[api_keys]]
name = "backend"
hash = "third-secret-value"
"#
        .parse()
        .unwrap();
        let shown = toml::to_string(&masked(&table, false)).unwrap();
        for secret in ["first-secret", "second-secret", "third-secret"] {
            assert!(!shown.contains(secret), "{shown}");
        }
    }

    #[test]
    fn api_key_names_permissions_and_channels_stay_visible() {
        let table: toml::Table = r#"
[[api_keys]]
name = "backend"
sha256 = "aaaa-secret-digest"
permissions = ["publish", "read"]
channels = ["orders:*"]
[jwt]
hs256_secret = ["new-secret", "old-secret"]
rsa_public_key_pem = "/etc/herald/jwt.pem"
issuer = "https://issuer.example"
"#
        .parse()
        .unwrap();
        let shown = toml::to_string(&masked(&table, false)).unwrap();
        for visible in [
            "name = \"backend\"",
            "permissions = [\"publish\", \"read\"]",
            "channels = [\"orders:*\"]",
            "sha256 = \"****\"",
            "hs256_secret = [\"****\", \"****\"]",
            "rsa_public_key_pem = \"/etc/herald/jwt.pem\"",
            "issuer = \"https://issuer.example\"",
        ] {
            assert!(shown.contains(visible), "{visible} not in:\n{shown}");
        }
        for secret in ["aaaa-secret", "new-secret", "old-secret"] {
            assert!(!shown.contains(secret), "{shown}");
        }
    }
}
