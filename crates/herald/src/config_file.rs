//! The config file of `herald serve --config FILE` (TOML, see
//! `docs/configuration.md`).
//!
//! Every `herald serve` flag can be set in the file under its long name
//! with `_` for `-` (`lease_ttl = "30s"` for `--lease-ttl`); a flag
//! `--<section>-<name>` is set as `name` in `[<section>]` (`[tls] cert` for
//! `--tls-cert`). The mapping is generic: a flag added to `herald serve`
//! can be set in the file without any change here. The file's values become
//! the flags' defaults, so a flag on the command line or its `HERALD_*`
//! environment variable overrides the file, and the file overrides the
//! built-in default. Each value goes through the flag's own parser, so the
//! file accepts exactly what the command line accepts.
//!
//! Sections with typed fields refuse unknown keys by name (serde's
//! `deny_unknown_fields`); a top-level key that names no flag is refused
//! too. `[auth]` and `[namespaces]` are the access-control settings of
//! herald-server (`AuthConfig`, `NamespacesConfig`), refused by name on an
//! unknown key as well.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context};
use clap::builder::Resettable;
use clap::{Arg, ArgAction, Command};
use herald_auth::{AuthConfig, NamespacesConfig};
use herald_server::RetentionConfig;
use serde::{Deserialize, Serialize};

use crate::toml_syntax::syntax_error;

/// Sections whose keys are `herald serve` flags `--<section>-<key>`.
pub(crate) const FLAG_SECTIONS: [&str; 5] =
    ["tls", "cors", "centrifugo", "durable_streams", "console"];

/// Sections of typed settings that are not flags: access control and
/// retention policies.
const TABLE_SECTIONS: [&str; 3] = ["auth", "namespaces", "retention"];

/// Flags that cannot be set in the file: the file's own path, and the
/// default retention policy's flags, which override the file's
/// `[retention]` section (at the start and at every reload).
const NOT_IN_FILE: [&str; 4] = [
    "config",
    "retention-max-messages",
    "retention-max-age",
    "retention-max-bytes",
];

/// A parsed config file.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ConfigFile {
    /// Values for `herald serve` flags, by the flag's clap id, as the
    /// command line spells them (one string per value).
    pub(crate) flags: BTreeMap<String, Vec<String>>,
    /// `[auth]`: API keys, JWT keys, the cluster secret and publish rate
    /// limits (docs/security.md).
    pub(crate) auth: Option<AuthConfig>,
    /// `[namespaces.<name>]`: per-namespace rules (docs/security.md).
    pub(crate) namespaces: Option<NamespacesConfig>,
    /// `[retention]`: the default retention policy and
    /// `[retention.namespaces.<name>]` (docs/retention.md); re-read on
    /// SIGHUP by `retention.rs`.
    pub(crate) retention: Option<RetentionConfig>,
}

/// `[tls]`: the flags `--tls-cert`, `--tls-key` and `--tls-ca`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct TlsSection {
    /// PEM certificate chain (`--tls-cert`).
    #[serde(skip_serializing_if = "Option::is_none")]
    cert: Option<String>,
    /// PEM private key (`--tls-key`).
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    /// PEM file of extra trusted certificate authorities (`--tls-ca`).
    #[serde(skip_serializing_if = "Option::is_none")]
    ca: Option<String>,
}

/// `[cors]`: the flags `--cors-allowed-origins` and `--cors-max-age`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct CorsSection {
    /// Allowed origins (`--cors-allowed-origins`).
    #[serde(skip_serializing_if = "Option::is_none")]
    allowed_origins: Option<Vec<String>>,
    /// Preflight cache time, e.g. `"10m"` (`--cors-max-age`).
    #[serde(skip_serializing_if = "Option::is_none")]
    max_age: Option<String>,
}

/// `[centrifugo]`: the flags `--centrifugo-*` (docs/centrifugo.md).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct CentrifugoSection {
    /// Server ping period, e.g. `"25s"` (`--centrifugo-ping-interval`).
    #[serde(skip_serializing_if = "Option::is_none")]
    ping_interval: Option<String>,
    /// Longest wait for a pong (`--centrifugo-pong-timeout`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pong_timeout: Option<String>,
    /// Longest wait for `connect` (`--centrifugo-connect-timeout`).
    #[serde(skip_serializing_if = "Option::is_none")]
    connect_timeout: Option<String>,
    /// Longest wait of one write to a client (`--centrifugo-write-timeout`).
    #[serde(skip_serializing_if = "Option::is_none")]
    write_timeout: Option<String>,
    /// Presence on (`--centrifugo-presence`).
    #[serde(skip_serializing_if = "Option::is_none")]
    presence: Option<bool>,
    /// Presence rows' lifetime (`--centrifugo-presence-ttl`).
    #[serde(skip_serializing_if = "Option::is_none")]
    presence_ttl: Option<String>,
    /// Join and leave pushes on (`--centrifugo-join-leave`).
    #[serde(skip_serializing_if = "Option::is_none")]
    join_leave: Option<bool>,
    /// Join and leave pushes to every subscriber
    /// (`--centrifugo-force-push-join-leave`).
    #[serde(skip_serializing_if = "Option::is_none")]
    force_push_join_leave: Option<bool>,
    /// Most channels per connection (`--centrifugo-channel-limit`).
    #[serde(skip_serializing_if = "Option::is_none")]
    channel_limit: Option<u32>,
    /// Anonymous connects accepted (`--centrifugo-anonymous-connect`).
    #[serde(skip_serializing_if = "Option::is_none")]
    anonymous_connect: Option<bool>,
}

/// `[durable_streams]`: the flags `--durable-streams-*`
/// (docs/durable-streams.md).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct DurableStreamsSection {
    /// Served (`--durable-streams-enabled`).
    #[serde(skip_serializing_if = "Option::is_none")]
    enabled: Option<bool>,
    /// Path prefix, e.g. `"/ds"` (`--durable-streams-prefix`).
    #[serde(skip_serializing_if = "Option::is_none")]
    prefix: Option<String>,
    /// Long-poll wait, e.g. `"30s"` (`--durable-streams-long-poll-timeout`).
    #[serde(skip_serializing_if = "Option::is_none")]
    long_poll_timeout: Option<String>,
    /// Largest PUT or POST body in bytes
    /// (`--durable-streams-max-append-bytes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    max_append_bytes: Option<u64>,
    /// Most producers one stream keeps state for
    /// (`--durable-streams-max-producers-per-stream`).
    #[serde(skip_serializing_if = "Option::is_none")]
    max_producers_per_stream: Option<u64>,
    /// How long an idle producer's state is kept, e.g. `"7d"`
    /// (`--durable-streams-producer-idle-timeout`).
    #[serde(skip_serializing_if = "Option::is_none")]
    producer_idle_timeout: Option<String>,
    /// How long an append ahead of its producer's turn waits, e.g.
    /// `"300ms"` (`--durable-streams-producer-gap-wait`).
    #[serde(skip_serializing_if = "Option::is_none")]
    producer_gap_wait: Option<String>,
    /// Most messages one fork may copy
    /// (`--durable-streams-max-fork-messages`).
    #[serde(skip_serializing_if = "Option::is_none")]
    max_fork_messages: Option<u64>,
    /// Most bytes one fork may copy (`--durable-streams-max-fork-bytes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    max_fork_bytes: Option<u64>,
    /// Most live forks of one stream
    /// (`--durable-streams-max-forks-per-source`).
    #[serde(skip_serializing_if = "Option::is_none")]
    max_forks_per_source: Option<u64>,
}

/// `[console]`: the flags `--console-*` (docs/console.md).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct ConsoleSection {
    /// Pages served at `/console/` (`--console-enabled`).
    #[serde(skip_serializing_if = "Option::is_none")]
    enabled: Option<bool>,
}

/// Reads and parses the config file at `path` for the `herald serve`
/// command `serve`.
///
/// # Errors
/// The file cannot be read, or [`parse`] refuses it; the message names the
/// file.
pub(crate) fn load(path: &Path, serve: &Command) -> anyhow::Result<ConfigFile> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow!("cannot read the config file {}: {e}", path.display()))?;
    parse(&text, serve).with_context(|| format!("config file {}", path.display()))
}

/// Parses a config file's text for the `herald serve` command `serve`.
///
/// # Errors
/// Not TOML (line, column and reason only, see [`syntax_error`]); an
/// unknown key or section (named); a value of the wrong type or that the
/// flag's parser refuses (the key is named).
pub(crate) fn parse(text: &str, serve: &Command) -> anyhow::Result<ConfigFile> {
    let mut table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| anyhow!("{}", syntax_error(text, &e)))?;
    let mut file = ConfigFile {
        auth: table
            .remove("auth")
            .map(|value| typed_section("auth", value))
            .transpose()?,
        namespaces: table
            .remove("namespaces")
            .map(|value| typed_section("namespaces", value))
            .transpose()?,
        retention: table
            .remove("retention")
            .map(|value| typed_section("retention", value))
            .transpose()?,
        ..ConfigFile::default()
    };
    let mut settings: Vec<(String, toml::Value)> = Vec::new();
    if let Some(value) = table.remove("tls") {
        let section: TlsSection = typed_section("tls", value)?;
        settings.extend(prefixed("tls", &section)?);
    }
    if let Some(value) = table.remove("cors") {
        let section: CorsSection = typed_section("cors", value)?;
        settings.extend(prefixed("cors", &section)?);
    }
    if let Some(value) = table.remove("centrifugo") {
        let section: CentrifugoSection = typed_section("centrifugo", value)?;
        settings.extend(prefixed("centrifugo", &section)?);
    }
    if let Some(value) = table.remove("durable_streams") {
        let section: DurableStreamsSection = typed_section("durable_streams", value)?;
        settings.extend(prefixed("durable_streams", &section)?);
    }
    if let Some(value) = table.remove("console") {
        let section: ConsoleSection = typed_section("console", value)?;
        settings.extend(prefixed("console", &section)?);
    }
    settings.extend(table);
    for (key, value) in settings {
        let arg = flag_for_key(serve, &key)?;
        let values = command_line_values(&key, arg, value)?;
        for v in &values {
            check_value(arg, v).map_err(|e| anyhow!("key {key}: {}", clap_message(&e)))?;
        }
        file.flags.insert(arg.get_id().to_string(), values);
    }
    Ok(file)
}

/// `serve` with the file's values as the flags' defaults.
pub(crate) fn with_file_defaults(serve: Command, file: &ConfigFile) -> Command {
    file.flags.iter().fold(serve, |command, (id, values)| {
        let values = values.clone();
        command.mut_arg(id.as_str(), move |arg| arg.default_values(values))
    })
}

/// The file key of a `herald serve` flag: `section.key` for a flag of a
/// [`FLAG_SECTIONS`] section, else its long name with `_` for `-`. `None`
/// for flags the file cannot set.
pub(crate) fn key_for_flag(arg: &Arg) -> Option<String> {
    let long = arg.get_long()?;
    let takes_a_setting = matches!(
        arg.get_action(),
        ArgAction::Set | ArgAction::Append | ArgAction::SetTrue | ArgAction::SetFalse
    );
    if !takes_a_setting || NOT_IN_FILE.contains(&long) {
        return None;
    }
    let key = long.replace('-', "_");
    for section in FLAG_SECTIONS {
        if let Some(rest) = key.strip_prefix(section).and_then(|r| r.strip_prefix('_')) {
            return Some(format!("{section}.{rest}"));
        }
    }
    Some(key)
}

/// Deserializes section `name`, naming it in the error.
fn typed_section<T: serde::de::DeserializeOwned>(
    name: &str,
    value: toml::Value,
) -> anyhow::Result<T> {
    if !value.is_table() {
        bail!(
            "{name} must be a section ([{name}]), not a {}",
            value.type_str()
        );
    }
    value
        .try_into()
        .map_err(|e: toml::de::Error| anyhow!("[{name}]: {}", e.message().trim()))
}

/// A typed section's keys as `section.key` settings.
fn prefixed<T: Serialize>(section: &str, value: &T) -> anyhow::Result<Vec<(String, toml::Value)>> {
    let table = toml::Table::try_from(value).map_err(|e| anyhow!("[{section}]: {e}"))?;
    Ok(table
        .into_iter()
        .map(|(key, value)| (format!("{section}.{key}"), value))
        .collect())
}

/// The `herald serve` flag that file key `key` sets.
fn flag_for_key<'a>(serve: &'a Command, key: &str) -> anyhow::Result<&'a Arg> {
    if let Some(arg) = serve
        .get_arguments()
        .find(|arg| key_for_flag(arg).as_deref() == Some(key))
    {
        return Ok(arg);
    }
    let known: Vec<String> = serve.get_arguments().filter_map(key_for_flag).collect();
    let hint = if key.contains('-') && known.contains(&key.replace('-', "_")) {
        format!(" (write {})", key.replace('-', "_"))
    } else {
        String::new()
    };
    bail!(
        "unknown key {key}{hint}; the keys are {}, and the sections [{}]",
        known
            .iter()
            .filter(|k| !k.contains('.'))
            .cloned()
            .collect::<Vec<_>>()
            .join(", "),
        FLAG_SECTIONS
            .iter()
            .chain(TABLE_SECTIONS.iter())
            .copied()
            .collect::<Vec<_>>()
            .join("], [")
    )
}

/// A TOML value as the command-line strings of flag `arg`.
fn command_line_values(key: &str, arg: &Arg, value: toml::Value) -> anyhow::Result<Vec<String>> {
    let many = matches!(arg.get_action(), ArgAction::Append);
    match value {
        toml::Value::Array(items) if many => items
            .into_iter()
            .map(|item| scalar(key, item))
            .collect::<anyhow::Result<_>>(),
        toml::Value::Array(_) => bail!("key {key} takes one value, not an array"),
        other => scalar(key, other).map(|v| vec![v]),
    }
}

/// A scalar TOML value as a command-line string.
fn scalar(key: &str, value: toml::Value) -> anyhow::Result<String> {
    match value {
        toml::Value::String(s) => Ok(s),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        other => bail!(
            "key {key} takes a string, number or boolean, not a {}",
            other.type_str()
        ),
    }
}

/// Runs `value` through flag `arg`'s own parser, as if given on a command
/// line with that flag alone.
fn check_value(arg: &Arg, value: &str) -> Result<(), clap::Error> {
    let long = arg.get_long().unwrap_or_default();
    let action = match arg.get_action() {
        ArgAction::Append => ArgAction::Append,
        _ => ArgAction::Set,
    };
    let probe = arg
        .clone()
        .action(action)
        .num_args(1)
        .required(false)
        .requires(Resettable::Reset)
        .env(Resettable::Reset)
        .default_values(Vec::<String>::new());
    Command::new("serve")
        .no_binary_name(true)
        .arg(probe)
        .try_get_matches_from([format!("--{long}={value}")])
        .map(drop)
}

/// A clap error's message without its `error: ` prefix and usage lines.
fn clap_message(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    first.trim_start_matches("error: ").to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::settings::serve_command;

    fn serve() -> Command {
        serve_command()
    }

    #[test]
    fn every_flag_has_a_key_and_values_go_through_its_parser() {
        let file = parse(
            r#"
listen = "0.0.0.0:7700"
pool_size = 4
lease_ttl = "20s"
insecure_no_auth = true

[tls]
cert = "/etc/herald/cert.pem"
key = "/etc/herald/key.pem"

[cors]
allowed_origins = ["https://a.example", "https://b.example"]
max_age = "1h"

[auth]
api_keys = []

[centrifugo]
presence = true
join_leave = true
force_push_join_leave = false
channel_limit = 16
anonymous_connect = true

[namespaces.chat]
presence = false
join_leave = true
"#,
            &serve(),
        )
        .unwrap();
        assert_eq!(file.flags["pool_size"], ["4"]);
        assert_eq!(file.flags["centrifugo_join_leave"], ["true"]);
        assert_eq!(file.flags["centrifugo_force_push_join_leave"], ["false"]);
        assert_eq!(file.flags["centrifugo_channel_limit"], ["16"]);
        assert_eq!(file.flags["centrifugo_anonymous_connect"], ["true"]);
        let chat = file.namespaces.as_ref().unwrap()["chat"];
        assert_eq!((chat.presence, chat.join_leave), (Some(false), Some(true)));
        assert_eq!(file.flags["insecure_no_auth"], ["true"]);
        assert_eq!(file.flags["tls_cert"], ["/etc/herald/cert.pem"]);
        assert_eq!(
            file.flags["cors_allowed_origins"],
            ["https://a.example", "https://b.example"]
        );
        assert!(file.auth.is_some());
    }

    #[test]
    fn typos_and_bad_values_are_refused_by_key() {
        for (text, words) in [
            ("lisen = \"1.2.3.4:1\"", "unknown key lisen"),
            ("lease-ttl = \"5s\"", "(write lease_ttl)"),
            ("lease_ttl = \"5x\"", "key lease_ttl"),
            ("pool_size = \"many\"", "key pool_size"),
            ("listen = [\"a:1\"]", "key listen takes one value"),
            ("[tls]\ncret = \"x\"", "[tls]: unknown field `cret`"),
            ("[cors]\nmax_age = 5", "[cors]"),
            (
                "[centrifugo]\njoinleave = true",
                "unknown field `joinleave`",
            ),
            ("[namespaces.chat]\njoin_leave = 1", "[namespaces]"),
            (
                "[centrifugo]\nchannel_limit = 0",
                "key centrifugo.channel_limit",
            ),
            ("config = \"other.toml\"", "unknown key config"),
            ("auth = 1", "auth must be a section"),
            ("listen = ", "line 1"),
        ] {
            let error = format!("{:#}", parse(text, &serve()).unwrap_err());
            assert!(error.contains(words), "{text:?}: {error}");
        }
    }

    #[test]
    fn a_syntax_error_gives_line_and_column_but_not_the_line() {
        for (text, place) in [
            (
                "listen = \"127.0.0.1:1\"\ndatabase = postgres://u:hunter2-pw@db/h\n",
                "line 2, column 12",
            ),
            ("[auth]\ncluster_secret = hunter2-pw\n", "line 2, column 18"),
            ("[auth.jwt]\nhs256_secret = \"hunter2-pw\n", "line 2"),
            ("[auth]\n  cluster_secret = \"é\" hunter2-pw\n", "line 2"),
        ] {
            let error = format!("{:#}", parse(text, &serve()).unwrap_err());
            assert!(error.contains(place), "{text:?}: {error}");
            assert!(!error.contains("hunter2"), "{text:?}: {error}");
        }
    }

    mod property {
        use proptest::prelude::*;

        use super::*;

        /// Keys: every real one, near misses, and arbitrary names.
        fn key() -> impl Strategy<Value = String> {
            let known: Vec<String> = serve().get_arguments().filter_map(key_for_flag).collect();
            prop_oneof![
                proptest::sample::select(known.clone()),
                proptest::sample::select(known).prop_map(|k| format!("{k}x")),
                "[a-z_]{1,12}",
            ]
        }

        /// Values of every TOML type, and strings that some parsers take.
        fn value() -> impl Strategy<Value = String> {
            prop_oneof![
                Just("\"5s\"".to_owned()),
                Just("\"127.0.0.1:0\"".to_owned()),
                Just("\"postgres://u:p@h/d\"".to_owned()),
                Just("[\"https://a.example\"]".to_owned()),
                Just("{ a = 1 }".to_owned()),
                Just("1979-05-27T07:32:00Z".to_owned()),
                any::<i64>().prop_map(|i| i.to_string()),
                any::<bool>().prop_map(|b| b.to_string()),
                "\"[ -~]{0,16}\"".prop_map(|s| s.replace('\\', "")),
            ]
        }

        /// A document of `key = value` lines, some under a section.
        fn document() -> impl Strategy<Value = (Vec<(String, String)>, Option<String>)> {
            (
                proptest::collection::vec((key(), value()), 0..6),
                proptest::option::of(proptest::sample::select(vec![
                    "tls".to_owned(),
                    "cors".to_owned(),
                    "auth".to_owned(),
                    "limits".to_owned(),
                    "other".to_owned(),
                ])),
            )
        }

        proptest! {
            #![proptest_config(ProptestConfig {
                cases: 256,
                failure_persistence: None,
                ..ProptestConfig::default()
            })]

            /// Any text: accepted, or refused with a message; never a panic.
            #[test]
            fn any_text_is_accepted_or_refused_with_a_message(text in "\\PC{0,200}") {
                if let Err(e) = parse(&text, &serve()) {
                    let message = format!("{e:#}");
                    prop_assert!(!message.trim().is_empty());
                }
            }

            /// A well-formed document is accepted, or refused with a message
            /// that names a key or section of it, or a place in it.
            #[test]
            fn a_refusal_names_the_problem((lines, section) in document()) {
                let mut text = String::new();
                let mut names: Vec<String> = Vec::new();
                for (i, (key, value)) in lines.iter().enumerate() {
                    if i == lines.len() / 2 {
                        if let Some(section) = &section {
                            text.push_str(&format!("[{section}]\n"));
                            names.push(section.clone());
                        }
                    }
                    text.push_str(&format!("{key} = {value}\n"));
                    // A dotted key is a key in a section: either part names it.
                    names.extend(key.split('.').map(str::to_owned));
                }
                if let Err(e) = parse(&text, &serve()) {
                    let message = format!("{e:#}");
                    prop_assert!(
                        message.contains("line ") || names.iter().any(|n| message.contains(n.as_str())),
                        "{:?}: {}", text, message
                    );
                }
            }
        }
    }
}
