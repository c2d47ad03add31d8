//! The deployment files (Dockerfile, deploy/compose, deploy/kubernetes,
//! deploy/systemd) against each other and against the server they deploy:
//! the ports, users, volumes and probes they name are the ones the image and
//! `herald serve` have, the compose file's nginx is the documented server
//! block of docs/operations.md, and every probe path answers 200 on a
//! running node. `herald ready`, the image's health check, is run against
//! a holder, a standby and no node at all. The compose example config,
//! completed as its comments say, starts both nodes on PostgreSQL
//! (`HERALD_TEST_DATABASE_URL`).
//!
//! The YAML files are read with Python's PyYAML (`python3 -c 'import yaml'`;
//! Debian: python3-yaml), which the test command's machine has; without it
//! these tests fail saying so. What running the image and the cluster needs
//! (a container runtime, a registry, a Kubernetes cluster) is not done here:
//! scripts/test-container builds and runs the image; docs/operations.md
//! ("Deploying") says what is tested and what is not.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use herald_testkit::process::{herald, Server};
use herald_testkit::WAIT;
use serde_json::Value;

/// The repository's root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The open file limit `herald serve` wants at least (`fd_limit::RECOMMENDED`
/// in the binary), in descriptors.
const NOFILE_RECOMMENDED: u64 = 4096;

/// Every YAML document of `path`, as JSON values, read by PyYAML's
/// `safe_load_all`.
fn yaml_documents(path: &Path) -> Vec<Value> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml\n\
             json.dump(list(yaml.safe_load_all(open(sys.argv[1]))), sys.stdout)",
        ])
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("python3 is needed to read the YAML files: {e}"));
    assert!(
        out.status.success(),
        "reading {} with python3 and PyYAML failed (Debian: apt-get install python3-yaml): {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON from python3")
}

/// What the Dockerfile's final stage says about the image.
#[derive(Debug, Default)]
struct Image {
    user: String,
    env: BTreeMap<String, String>,
    volumes: Vec<String>,
    exposed: Vec<u16>,
    healthcheck: Vec<String>,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
}

/// The JSON-array form of an instruction's argument (`["a", "b"]`).
fn exec_form(text: &str) -> Vec<String> {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not a JSON array: {text}: {e}"))
}

/// Reads the final stage of the Dockerfile (continuation lines joined,
/// comments dropped).
fn image() -> Image {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let joined = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("\\\n", " ");
    let final_stage = joined
        .rsplit_once("\nFROM ")
        .expect("a multi-stage Dockerfile")
        .1;
    let mut image = Image::default();
    for line in final_stage.lines().skip(1) {
        let Some((instruction, rest)) = line.trim().split_once(' ') else {
            continue;
        };
        match instruction {
            "USER" => image.user = rest.trim().to_owned(),
            "ENV" => {
                for pair in rest.split_whitespace() {
                    let (key, value) = pair.split_once('=').expect("ENV key=value");
                    image.env.insert(key.to_owned(), value.to_owned());
                }
            }
            "VOLUME" => image.volumes = exec_form(rest),
            "EXPOSE" => image
                .exposed
                .extend(rest.split_whitespace().map(|p| p.parse::<u16>().unwrap())),
            "HEALTHCHECK" => {
                let (_, command) = rest.split_once("CMD").expect("HEALTHCHECK ... CMD");
                image.healthcheck = exec_form(command);
            }
            "ENTRYPOINT" => image.entrypoint = exec_form(rest),
            "CMD" => image.cmd = exec_form(rest),
            _ => {}
        }
    }
    image
}

/// The port of an `IP:PORT` listen address.
fn port_of(listen: &str) -> u16 {
    listen.rsplit_once(':').unwrap().1.parse().unwrap()
}

#[test]
fn the_image_runs_herald_serve_as_non_root_with_a_data_volume_and_a_readyz_health_check() {
    let image = image();
    assert_eq!(image.user, "65532:65532", "{image:?}");
    assert_eq!(image.entrypoint, ["/usr/local/bin/herald"], "{image:?}");
    assert_eq!(image.cmd, ["serve"], "{image:?}");
    assert_eq!(
        image.healthcheck,
        ["/usr/local/bin/herald", "ready"],
        "{image:?}"
    );
    assert_eq!(
        image.volumes,
        [image.env["HERALD_DATA_DIR"].clone()],
        "{image:?}"
    );
    assert_eq!(
        image.exposed,
        [port_of(&image.env["HERALD_LISTEN"])],
        "{image:?}"
    );
    assert!(image.env["HERALD_LISTEN"].starts_with("0.0.0.0:"));
    let ignored = std::fs::read_to_string(repo().join(".dockerignore")).unwrap();
    for dir in ["target", "tests/clients/node_modules", ".git"] {
        assert!(
            ignored.lines().any(|l| l.trim() == dir),
            ".dockerignore leaves {dir} in the build context"
        );
    }
}

/// The server block of docs/operations.md between its marking comments.
fn documented_nginx_block() -> String {
    let page = std::fs::read_to_string(repo().join("docs/operations.md")).unwrap();
    let (_, rest) = page
        .split_once("<!-- nginx-server-block:begin -->")
        .unwrap();
    let (block, _) = rest.split_once("<!-- nginx-server-block:end -->").unwrap();
    let block = block.trim();
    let block = block.strip_prefix("```nginx").unwrap();
    block.strip_suffix("```").unwrap().trim().to_owned()
}

/// The `server host:port ...;` lines of an nginx `upstream` block:
/// `(host, port)`.
fn upstream_servers(conf: &str) -> Vec<(String, u16)> {
    conf.lines()
        .map(str::trim)
        .filter(|l| l.ends_with(';'))
        .filter_map(|l| l.strip_prefix("server "))
        .map(|rest| {
            let addr = rest.split_whitespace().next().unwrap();
            let (host, port) = addr.rsplit_once(':').unwrap();
            (host.to_owned(), port.parse().unwrap())
        })
        .collect()
}

#[test]
fn the_compose_cluster_runs_the_image_behind_the_documented_nginx_front() {
    let dir = repo().join("deploy/compose");
    let image = image();
    let port = image.exposed[0];
    let compose = yaml_documents(&dir.join("compose.yaml")).remove(0);
    let services = compose["services"].as_object().unwrap();
    let nodes: Vec<(&String, &Value)> = services
        .iter()
        .filter(|(_, s)| s["image"] == "localhost/herald:latest")
        .collect();
    assert_eq!(nodes.len(), 2, "two Herald nodes: {compose}");
    let mut node_ids = Vec::new();
    for (name, node) in &nodes {
        let context = dir.join(node["build"]["context"].as_str().unwrap());
        assert!(
            context.join(node["build"]["dockerfile"].as_str().unwrap())
                == context.join("Dockerfile")
                && context.join("Dockerfile").is_file(),
            "{name} builds the Dockerfile: {node}"
        );
        let env = &node["environment"];
        node_ids.push(env["HERALD_NODE_ID"].as_str().unwrap().to_owned());
        assert_eq!(
            env["HERALD_ADVERTISE_URL"],
            format!("http://{name}:{port}"),
            "{name}: the other node reaches it by its service name and the image's port"
        );
        assert!(env["HERALD_DATABASE_URL"]
            .as_str()
            .unwrap()
            .starts_with("postgres://herald:${HERALD_DB_PASSWORD"));
        let volumes: Vec<&str> = node["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert!(
            volumes.contains(&format!("{name}:{}", image.volumes[0]).as_str()),
            "{name} keeps the image's volume in a volume of its own: {volumes:?}"
        );
        let config = env["HERALD_CONFIG"].as_str().unwrap();
        assert!(
            volumes
                .iter()
                .any(|v| v.ends_with(&format!(":{config}:ro"))),
            "{name} mounts its HERALD_CONFIG: {volumes:?}"
        );
        assert!(node["ulimits"]["nofile"]["soft"].as_u64().unwrap() >= NOFILE_RECOMMENDED);
        assert_eq!(node["restart"], "on-failure");
        assert_eq!(
            node["depends_on"]["postgres"]["condition"],
            "service_healthy"
        );
    }
    node_ids.dedup();
    assert_eq!(node_ids.len(), 2, "distinct node ids: {node_ids:?}");

    // nginx: the documented block, only the upstream's nodes changed.
    let conf = std::fs::read_to_string(dir.join("nginx.conf")).unwrap();
    let conf_block: String = conf
        .lines()
        .skip_while(|l| l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let documented = documented_nginx_block();
    let without_servers = |block: &str| -> Vec<String> {
        block
            .lines()
            .filter(|l| !(l.trim().starts_with("server ") && l.ends_with(';')))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        without_servers(conf_block.trim()),
        without_servers(&documented),
        "deploy/compose/nginx.conf differs from docs/operations.md's server block"
    );
    let expected: Vec<(String, u16)> = nodes.iter().map(|(n, _)| ((*n).clone(), port)).collect();
    assert_eq!(upstream_servers(&conf_block), expected);
    let nginx = &services["nginx"];
    assert_eq!(nginx["ports"][0], "8080:80", "{nginx}");
    assert!(conf_block.contains("listen 80;"));
    let mount = nginx["volumes"][0].as_str().unwrap();
    assert!(mount.starts_with("./nginx.conf:"), "{mount}");

    // The nodes trust nginx's fixed address, and only that.
    let nginx_ip = nginx["networks"]["herald"]["ipv4_address"]
        .as_str()
        .unwrap();
    let example = std::fs::read_to_string(dir.join("herald.toml.example")).unwrap();
    let trusted = example
        .lines()
        .find(|l| l.starts_with("trusted_proxy"))
        .expect("trusted_proxy in herald.toml.example");
    assert_eq!(trusted, format!("trusted_proxy = [\"{nginx_ip}\"]"));
    // Written above the first section, where it is a top-level key.
    let first_section = example.find("\n[").unwrap();
    assert!(example.find("trusted_proxy").unwrap() < first_section);
}

/// Everything of a StatefulSet's pod template's first container.
fn herald_container(manifests: &[Value]) -> (&Value, &Value) {
    let set = manifests
        .iter()
        .find(|m| m["kind"] == "StatefulSet")
        .expect("a StatefulSet");
    let pod = &set["spec"]["template"]["spec"];
    (set, &pod["containers"][0])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_probes_point_at_routes_that_answer_200_on_a_running_node() {
    let manifests = yaml_documents(&repo().join("deploy/kubernetes/herald.yaml"));
    let image = image();
    let (set, container) = herald_container(&manifests);
    let pod = &set["spec"]["template"]["spec"];
    let labels = &set["spec"]["template"]["metadata"]["labels"];
    assert_eq!(set["spec"]["selector"]["matchLabels"], *labels);

    // Ports: the image's, by name.
    let ports = container["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 1, "{container}");
    assert_eq!(ports[0]["containerPort"], image.exposed[0]);
    let port_name = ports[0]["name"].as_str().unwrap();
    let env: BTreeMap<&str, &Value> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e))
        .collect();
    assert_eq!(
        port_of(env["HERALD_LISTEN"]["value"].as_str().unwrap()),
        image.exposed[0]
    );
    let advertise = env["HERALD_ADVERTISE_URL"]["value"].as_str().unwrap();
    assert!(
        advertise.ends_with(&format!(":{}", image.exposed[0])),
        "{advertise}"
    );

    // The Services: the pods' labels, the container's port.
    let services: Vec<&Value> = manifests
        .iter()
        .filter(|m| m["kind"] == "Service")
        .collect();
    assert!(!services.is_empty());
    for service in &services {
        assert_eq!(service["spec"]["selector"], *labels, "{service}");
        assert_eq!(
            service["spec"]["ports"][0]["targetPort"], port_name,
            "{service}"
        );
    }
    let headless = services
        .iter()
        .find(|s| s["metadata"]["name"] == set["spec"]["serviceName"])
        .expect("the StatefulSet's governing Service");
    assert_eq!(headless["spec"]["clusterIP"], "None");
    assert!(
        advertise.contains(&format!(
            ".{}.",
            headless["metadata"]["name"].as_str().unwrap()
        )),
        "the advertise URL names the pod's DNS name: {advertise}"
    );

    // The image's user and volume.
    assert_eq!(
        format!(
            "{}:{}",
            pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]
        ),
        image.user
    );
    let data_mounted = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["mountPath"] == image.volumes[0].as_str());
    assert!(data_mounted, "the image's volume is mounted: {container}");
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);

    // A disruption budget for these pods.
    let budget = manifests
        .iter()
        .find(|m| m["kind"] == "PodDisruptionBudget")
        .expect("a PodDisruptionBudget");
    assert_eq!(budget["spec"]["selector"]["matchLabels"], *labels);
    assert_eq!(budget["spec"]["maxUnavailable"], 1);

    // Readiness is /readyz itself: a standby is ready (never role=holder).
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    let node = Server::start(tempfile::tempdir().unwrap().path()).await;
    for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["port"], port_name, "{probe}");
        let path = get["path"].as_str().unwrap();
        let answer = node.api.get(path).await;
        assert_eq!(answer.status, 200, "{probe} {path}: {answer:?}");
    }
}

/// The `Key=value` lines of a systemd unit, in order.
fn unit_settings(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

#[test]
fn the_systemd_unit_gives_the_node_its_data_dir_enough_descriptors_and_no_privileges() {
    let text = std::fs::read_to_string(repo().join("deploy/systemd/herald.service")).unwrap();
    let settings = unit_settings(&text);
    let get = |key: &str| -> Vec<&str> {
        settings
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    };
    let one = |key: &str| -> &str {
        let values = get(key);
        assert_eq!(values.len(), 1, "{key}: {values:?}");
        values[0]
    };
    assert!(one("ExecStart").ends_with("/herald serve"));
    let env: BTreeMap<&str, &str> = get("Environment")
        .into_iter()
        .map(|kv| kv.split_once('=').unwrap())
        .collect();
    // ProtectSystem=strict leaves StateDirectory= writable, nothing else.
    assert_eq!(one("ProtectSystem"), "strict");
    assert_eq!(
        env["HERALD_DATA_DIR"],
        format!("/var/lib/{}", one("StateDirectory"))
    );
    assert!(one("LimitNOFILE").parse::<u64>().unwrap() >= NOFILE_RECOMMENDED);
    assert_eq!(one("Restart"), "on-failure");
    for (key, value) in [
        ("NoNewPrivileges", "yes"),
        ("PrivateTmp", "yes"),
        ("ProtectHome", "yes"),
        ("KillSignal", "SIGTERM"),
    ] {
        assert_eq!(one(key), value, "{key}");
    }
    assert!(!["root", "0", ""].contains(&one("User")));
    assert_eq!(one("CapabilityBoundingSet"), "");
}

/// Runs `herald ready` with `args`; returns its exit status's success and
/// its stdout and stderr.
async fn ready(args: &[&str]) -> (bool, String, String) {
    let out = herald()
        .arg("ready")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .expect("run herald ready");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herald_ready_exits_0_only_when_the_node_answers_readyz_with_200() {
    let dir = tempfile::tempdir().unwrap();
    let holder = Server::start_with(dir.path(), &["--node-id", "node-a"]).await;
    holder.api.wait_role("holder", WAIT).await;
    let standby = Server::start_with(dir.path(), &["--node-id", "node-b"]).await;
    standby.api.wait_role("standby", WAIT).await;

    let (ok, out, err) = ready(&["--server", &holder.url]).await;
    assert!(ok, "{out} {err}");
    let (ok, out, err) = ready(&["--server", &holder.url, "--holder"]).await;
    assert!(ok, "{out} {err}");
    let (ok, out, err) = ready(&["--server", &standby.url]).await;
    assert!(ok, "a standby serves: {out} {err}");
    let (ok, out, err) = ready(&["--server", &standby.url, "--holder"]).await;
    assert!(!ok, "a standby is not the holder: {out} {err}");
    assert!(out.contains("not_holder"), "{out}");

    // No node there: exit status 1, the reason on stderr.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let (ok, out, err) = ready(&["--server", &format!("http://{closed}")]).await;
    assert!(!ok, "{out}");
    assert!(err.contains("/readyz"), "{err}");
}

/// deploy/compose/herald.toml.example, completed as its comments say (a
/// cluster secret and a generated API key appended, mode 0644), is a
/// config `herald config check` accepts and on which the two nodes of
/// compose.yaml start on one PostgreSQL database: it configures the
/// `[auth]` their `trusted_proxy` requires, and a publish with the key
/// through the standby is forwarded to the holder and stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compose_config_completed_as_its_comments_say_starts_both_nodes() {
    let db = herald_testkit::TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config =
        std::fs::read_to_string(repo().join("deploy/compose/herald.toml.example")).unwrap();
    // printf 'cluster_secret = "%s"\n' "$(openssl rand -hex 32)" >> herald.toml
    config.push_str(&format!("cluster_secret = \"{}\"\n", "5e".repeat(32)));
    let generated = herald()
        .args([
            "keys",
            "generate",
            "--name",
            "backend",
            "--permissions",
            "publish,read",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .unwrap();
    assert!(generated.status.success());
    config.push_str(&String::from_utf8(generated.stdout).unwrap());
    let shown = String::from_utf8(generated.stderr).unwrap();
    let key = shown
        .lines()
        .skip_while(|l| !l.starts_with("API key"))
        .nth(1)
        .expect("the key, on the line after `API key ...:`")
        .trim()
        .to_owned();
    let path = dir.path().join("herald.toml");
    std::fs::write(&path, &config).unwrap();
    let path = path.to_str().unwrap();

    let check = herald()
        .args(["config", "check", path])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );

    let url = db.url().to_string();
    let mut nodes = Vec::new();
    for id in ["herald-a", "herald-b"] {
        let data = dir.path().join(id);
        let flags = ["--config", path, "--database", &url, "--node-id", id];
        nodes.push(Server::start_with(&data, &flags).await);
    }
    nodes[0].api.wait_role("holder", WAIT).await;
    nodes[1].api.wait_role("standby", WAIT).await;
    let through_standby = herald_testkit::api::Api::with_api_key(&nodes[1].url, &key);
    let offset = through_standby
        .publish("news", &serde_json::json!({"hello": "world"}))
        .await;
    assert_eq!(offset, 1);
}
