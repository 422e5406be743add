//! Static checks of `deploy/` (no Docker engine or cluster runs here): every YAML parses;
//! the compose file's services, ports, volumes, dependencies and health checks agree; the
//! Kubernetes manifests carry their required fields, probes on `/healthz` and resources;
//! every image (compose, manifests, Dockerfile stages) is pinned; the Kafka topic settings
//! agree with the script that applies them and with weft's topic names; the ClickHouse
//! cluster migrations cover every table of the default set with replicated or distributed
//! engines, column for column (name, type, codec, MATERIALIZED expression, in order).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_yaml::Value;

fn deploy() -> PathBuf {
    common::repo_root().join("deploy")
}

fn yaml_docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| {
            serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files(&p, ext));
        } else if p.extension().is_some_and(|x| x == ext) {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// `name:tag` or `name@sha256:...`, never `latest`, never a bare name.
fn assert_pinned(image: &str, at: &str) {
    let (name, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    if let Some(d) = digest {
        assert!(
            d.starts_with("sha256:") && d.len() == 71,
            "{at}: bad digest in {image}"
        );
    }
    // The tag is after the last ':' that follows the last '/' (a registry may have a port).
    let last = name.rsplit('/').next().unwrap_or(name);
    let tag = last.split_once(':').map(|(_, t)| t);
    match tag {
        Some(t) => {
            assert!(
                !t.is_empty() && t != "latest",
                "{at}: image {image} is not pinned"
            );
            assert!(
                t.chars().any(|c| c.is_ascii_digit()),
                "{at}: tag of {image} names no version"
            );
        }
        None => assert!(digest.is_some(), "{at}: image {image} has no tag or digest"),
    }
}

#[test]
fn every_yaml_file_parses() {
    let mut n = 0;
    for dir in [deploy(), common::repo_root().join("dashboards")] {
        for ext in ["yaml", "yml"] {
            for f in files(&dir, ext) {
                let docs = yaml_docs(&f);
                assert!(!docs.is_empty(), "{}: empty", f.display());
                n += 1;
            }
        }
    }
    assert!(n >= 10, "only {n} YAML files");
}

/// The compose file with its `<<: *anchor` merge keys applied.
fn compose() -> Value {
    let mut c = yaml_docs(&deploy().join("docker/compose.yaml")).remove(0);
    c.apply_merge().unwrap();
    for (_, s) in c["services"].as_mapping_mut().unwrap() {
        s.apply_merge().unwrap();
    }
    c
}

fn map_keys(v: &Value) -> BTreeSet<String> {
    v.as_mapping()
        .map(|m| {
            m.keys()
                .filter_map(|k| k.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn compose_services_ports_volumes_and_dependencies_agree() {
    let c = compose();
    let services = c["services"].as_mapping().unwrap();
    let names: BTreeSet<String> = map_keys(&c["services"]);
    for want in [
        "kafka",
        "clickhouse",
        "grafana",
        "migrate",
        "ingest",
        "router",
        "gateway",
        "audit",
    ] {
        assert!(names.contains(want), "compose has no service {want}");
    }
    let named_volumes = map_keys(&c["volumes"]);
    let mut used_volumes = BTreeSet::new();
    let mut host_ports = BTreeSet::new();
    let compose_dir = deploy().join("docker");
    for (name, s) in services {
        let name = name.as_str().unwrap();
        let get = |k: &str| -> Value { s[k].clone() };
        let image = get("image");
        let image = image
            .as_str()
            .unwrap_or_else(|| panic!("service {name} has no image"));
        assert_pinned(image, &format!("compose service {name}"));
        if !get("build").is_null() {
            let df = get("build")["dockerfile"].as_str().unwrap().to_owned();
            let ctx = get("build")["context"].as_str().unwrap().to_owned();
            assert!(
                compose_dir.join(&ctx).join(&df).is_file(),
                "{name}: no Dockerfile {ctx}/{df}"
            );
        }
        // depends_on names real services, with a condition the target can satisfy.
        for (dep, cond) in get("depends_on").as_mapping().into_iter().flatten() {
            let dep = dep.as_str().unwrap();
            assert!(names.contains(dep), "{name} depends on unknown {dep}");
            let cond = cond["condition"].as_str().unwrap_or("service_started");
            let target = &services[dep];
            match cond {
                "service_healthy" => assert!(
                    !target["healthcheck"].is_null(),
                    "{name} waits for {dep} to be healthy, but {dep} has no healthcheck"
                ),
                "service_completed_successfully" => assert!(
                    target["restart"].as_str() == Some("no"),
                    "{name} waits for one-shot {dep}, which must not restart"
                ),
                "service_started" => {}
                other => panic!("{name}: unknown condition {other}"),
            }
        }
        // Ports: host side on loopback only, no host port twice.
        for p in get("ports").as_sequence().into_iter().flatten() {
            let p = p.as_str().unwrap();
            let parts: Vec<&str> = p.split(':').collect();
            assert_eq!(parts.len(), 3, "{name}: port {p} must be IP:HOST:CONTAINER");
            assert_eq!(
                parts[0], "127.0.0.1",
                "{name}: {p} publishes beyond loopback"
            );
            assert!(
                host_ports.insert(parts[1].to_owned()),
                "host port {} twice",
                parts[1]
            );
        }
        // Volumes: named ones are declared; bind mounts exist in the repository.
        for v in get("volumes").as_sequence().into_iter().flatten() {
            let v = v.as_str().unwrap();
            let src = v.split(':').next().unwrap();
            if src.starts_with('.') || src.starts_with('/') {
                assert!(
                    compose_dir.join(src).exists(),
                    "{name}: bind mount {src} does not exist"
                );
            } else {
                assert!(
                    named_volumes.contains(src),
                    "{name}: volume {src} not declared"
                );
                used_volumes.insert(src.to_owned());
            }
        }
        // weft services listening beyond loopback must say so explicitly.
        let cmd: Vec<String> = get("command")
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_str().map(str::to_owned))
            .collect();
        if let Some(i) = cmd.iter().position(|a| a == "--listen") {
            let addr = &cmd[i + 1];
            if !addr.starts_with("127.") {
                assert!(
                    cmd.iter().any(|a| a == "--allow-remote"),
                    "{name} listens on {addr} without --allow-remote"
                );
            }
            // Its health check probes the port it listens on.
            let port = addr.rsplit(':').next().unwrap();
            let hc = serde_yaml::to_string(&get("healthcheck")).unwrap();
            assert!(
                hc.contains(&format!(":{port}/healthz")),
                "{name}: healthcheck does not probe /healthz on {port}"
            );
        }
    }
    assert_eq!(
        used_volumes, named_volumes,
        "declared volumes that no service uses"
    );
    // Grafana gets the plugin and the provisioning.
    let g = serde_yaml::to_string(&c["services"]["grafana"]).unwrap();
    assert!(g.contains("grafana-clickhouse-datasource"));
    assert!(g.contains("/etc/grafana/provisioning/datasources"));
    assert!(g.contains("/etc/grafana/provisioning/dashboards"));
    // Kafka runs in KRaft mode (no ZooKeeper).
    let k = &c["services"]["kafka"]["environment"];
    assert!(k["KAFKA_PROCESS_ROLES"]
        .as_str()
        .is_some_and(|r| r.contains("controller")));
    assert!(!serde_yaml::to_string(&c).unwrap().contains("zookeeper"));
}

#[test]
fn dockerfile_is_multi_stage_and_pinned() {
    let text = std::fs::read_to_string(deploy().join("docker/Dockerfile")).unwrap();
    let mut stages = Vec::new();
    for line in text.lines().map(str::trim) {
        let Some(rest) = line.strip_prefix("FROM ") else {
            continue;
        };
        let words: Vec<&str> = rest
            .split_whitespace()
            .filter(|w| !w.starts_with("--"))
            .collect();
        let image = words[0];
        assert!(
            !image.contains('$'),
            "FROM {image}: pin the image, not an ARG"
        );
        if !stages.contains(&image.to_owned()) {
            assert_pinned(image, "Dockerfile");
        }
        if let Some(i) = words.iter().position(|w| w.eq_ignore_ascii_case("AS")) {
            stages.push(words[i + 1].to_owned());
        }
    }
    assert!(stages.len() >= 2, "not multi-stage: {stages:?}");
    assert!(
        text.contains("COPY --from="),
        "the runtime copies from the builder"
    );
    assert!(text.contains("--locked"), "builds with the lock file");
    assert!(text.contains("USER "), "runs as a non-root user");
    // Every workspace member is copied into the build.
    let cargo = std::fs::read_to_string(common::repo_root().join("Cargo.toml")).unwrap();
    let ws: toml::Value = toml::from_str(&cargo).unwrap();
    for m in ws["workspace"]["members"].as_array().unwrap() {
        let m = m.as_str().unwrap();
        assert!(
            text.contains(&format!("COPY {m} {m}")),
            "Dockerfile does not copy {m}"
        );
    }
}

/// Every Kubernetes object of `deploy/k8s`.
fn k8s_objects() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for f in files(&deploy().join("k8s"), "yaml") {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        for d in yaml_docs(&f) {
            out.push((name.clone(), d));
        }
    }
    out
}

#[test]
fn kubernetes_manifests_have_required_fields_probes_and_resources() {
    let objs = k8s_objects();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    let mut deployments = BTreeMap::new();
    let kustomization = objs
        .iter()
        .find(|(f, _)| f == "kustomization.yaml")
        .map(|(_, v)| v.clone())
        .unwrap();
    for r in kustomization["resources"].as_sequence().unwrap() {
        let r = r.as_str().unwrap();
        assert!(
            deploy().join("k8s").join(r).is_file(),
            "kustomization lists missing {r}"
        );
    }
    for (file, o) in &objs {
        let api = o["apiVersion"].as_str();
        let kind = o["kind"].as_str();
        assert!(
            api.is_some() && kind.is_some(),
            "{file}: apiVersion and kind required"
        );
        let kind = kind.unwrap();
        if kind == "Kustomization" {
            continue;
        }
        let name = o["metadata"]["name"].as_str();
        assert!(
            name.is_some_and(|n| !n.is_empty()),
            "{file}: {kind} without metadata.name"
        );
        *kinds.entry(kind.to_owned()).or_default() += 1;
        let pod = match kind {
            "Deployment" | "StatefulSet" => {
                let sel = &o["spec"]["selector"]["matchLabels"];
                let labels = &o["spec"]["template"]["metadata"]["labels"];
                for (k, v) in sel.as_mapping().unwrap() {
                    assert_eq!(
                        &labels[k], v,
                        "{file}: selector does not match the pod labels"
                    );
                }
                deployments.insert(name.unwrap().to_owned(), o.clone());
                &o["spec"]["template"]["spec"]
            }
            "Job" => &o["spec"]["template"]["spec"],
            _ => continue,
        };
        for c in pod["containers"].as_sequence().unwrap() {
            let cname = c["name"].as_str().unwrap();
            let at = format!("{file}: {}/{cname}", name.unwrap());
            assert_pinned(c["image"].as_str().unwrap(), &at);
            for k in ["requests", "limits"] {
                for r in ["cpu", "memory"] {
                    assert!(
                        !c["resources"][k][r].is_null(),
                        "{at}: resources.{k}.{r} missing"
                    );
                }
            }
            assert_eq!(
                pod["securityContext"]["runAsNonRoot"].as_bool(),
                Some(true),
                "{at}"
            );
            // Secrets come from secretKeyRef, never inline values.
            for e in c["env"].as_sequence().into_iter().flatten() {
                let n = e["name"].as_str().unwrap();
                if n.contains("PASSWORD") || n.contains("KEYS") {
                    assert!(
                        !e["valueFrom"]["secretKeyRef"].is_null(),
                        "{at}: {n} must come from a Secret"
                    );
                }
            }
            let args: Vec<&str> = c["args"]
                .as_sequence()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            if args.contains(&"--listen") {
                assert!(
                    args.contains(&"--allow-remote"),
                    "{at}: listens beyond loopback without --allow-remote"
                );
            }
            if matches!(kind, "Deployment" | "StatefulSet") {
                // The gateway is not ready while its spool is full (`/readyz`), yet alive.
                let ready = match c["name"].as_str() {
                    Some("gateway") => "/readyz",
                    _ => "/healthz",
                };
                for (probe, path) in [("readinessProbe", ready), ("livenessProbe", "/healthz")] {
                    assert_eq!(
                        c[probe]["httpGet"]["path"].as_str(),
                        Some(path),
                        "{at}: {probe} on {path}"
                    );
                }
            }
        }
    }
    for want in [
        "weft-router",
        "weft-gateway",
        "weft-ingest",
        "weft-ingest-facts",
        "weft-ingest-narratives",
        "weft-audit",
    ] {
        assert!(
            deployments.contains_key(want),
            "no Deployment {want}: {:?}",
            deployments.keys()
        );
    }
    for scaled in ["weft-router", "weft-gateway", "weft-ingest-facts"] {
        let r = deployments[scaled]["spec"]["replicas"].as_u64().unwrap();
        assert!(r >= 2, "{scaled} has {r} replicas");
    }
    // Only one process may project narratives, and role all must never run twice; one
    // sealer is enough.
    for single in ["weft-ingest", "weft-ingest-narratives", "weft-audit"] {
        let d = &deployments[single];
        assert_eq!(d["spec"]["replicas"].as_u64(), Some(1), "{single}");
        assert_eq!(
            d["spec"]["strategy"]["type"].as_str(),
            Some("Recreate"),
            "{single}"
        );
    }
    // Every Service selects pods of some Deployment.
    for (file, o) in objs.iter().filter(|(_, o)| o["kind"] == "Service") {
        let sel = &o["spec"]["selector"]["app.kubernetes.io/name"];
        assert!(
            deployments.contains_key(sel.as_str().unwrap()),
            "{file}: Service selects nothing"
        );
    }
    assert!(kinds.contains_key("ConfigMap") && kinds.contains_key("Job"));
}

/// The `weft.toml` of the ConfigMap `weft-config`.
fn configmap_weft_toml() -> toml::Value {
    let objs = k8s_objects();
    let cm = objs
        .iter()
        .find(|(_, o)| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "weft-config")
        .map(|(_, o)| o)
        .unwrap();
    toml::from_str(cm["data"]["weft.toml"].as_str().unwrap()).unwrap()
}

/// Bytes of a Kubernetes quantity in binary units (`2Gi`, `512Mi`).
fn quantity_bytes(q: &str) -> u64 {
    let units = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
    ];
    let (n, unit) = units
        .iter()
        .find_map(|(u, m)| q.strip_suffix(u).map(|n| (n, *m)))
        .unwrap_or((q, 1));
    n.parse::<u64>().unwrap() * unit
}

/// Events acknowledged while Kafka is down wait in the publisher's spool. An emptyDir goes
/// with its pod, so a pod deleted or rescheduled during an outage would lose them: every
/// workload that mounts the spool folder takes it from a PersistentVolumeClaim of its own (a
/// StatefulSet's volumeClaimTemplate: one spool per process, the spool's lock refuses a
/// second), at least `spool_max_bytes` large.
#[test]
fn spools_are_on_persistent_volumes_never_an_emptydir() {
    let toml = configmap_weft_toml();
    let spool_dir = toml["publisher"]["spool_dir"].as_str().unwrap();
    let spool_max = toml["publisher"]["spool_max_bytes"].as_integer().unwrap() as u64;
    let mut spools = Vec::new();
    for (file, o) in k8s_objects() {
        let kind = o["kind"].as_str().unwrap_or_default();
        if !matches!(kind, "Deployment" | "StatefulSet") {
            continue;
        }
        let name = o["metadata"]["name"].as_str().unwrap().to_owned();
        let pod = &o["spec"]["template"]["spec"];
        let claims = o["spec"]["volumeClaimTemplates"].as_sequence();
        for c in pod["containers"].as_sequence().unwrap() {
            let mounts = c["volumeMounts"].as_sequence().into_iter().flatten();
            for m in mounts.filter(|m| m["mountPath"].as_str() == Some(spool_dir)) {
                let at = format!("{file}: {name}/{}", c["name"].as_str().unwrap());
                let volume = m["name"].as_str().unwrap();
                let in_pod = pod["volumes"]
                    .as_sequence()
                    .into_iter()
                    .flatten()
                    .find(|v| v["name"].as_str() == Some(volume));
                assert!(
                    in_pod.is_none(),
                    "{at}: the spool at {spool_dir} is the pod volume {in_pod:?}, not a \
                     volumeClaimTemplate of its own: an emptyDir goes with the pod, and the \
                     acknowledged events spooled in it with it"
                );
                let claim = claims
                    .into_iter()
                    .flatten()
                    .find(|t| t["metadata"]["name"].as_str() == Some(volume))
                    .unwrap_or_else(|| panic!("{at}: no volume `{volume}` for the spool"));
                let size = claim["spec"]["resources"]["requests"]["storage"]
                    .as_str()
                    .unwrap();
                assert!(
                    quantity_bytes(size) >= spool_max,
                    "{at}: a {size} spool volume under spool_max_bytes = {spool_max}"
                );
                spools.push(name.clone());
            }
        }
    }
    spools.sort();
    assert_eq!(
        spools,
        ["weft-gateway", "weft-router"],
        "the publishing services"
    );
}

/// The ConfigMap's weft.toml uses only keys that weft's own example configuration has.
#[test]
fn configmap_weft_toml_uses_known_keys() {
    let objs = k8s_objects();
    let cm = objs
        .iter()
        .find(|(_, o)| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "weft-config")
        .map(|(_, o)| o)
        .unwrap();
    let ours: toml::Value = toml::from_str(cm["data"]["weft.toml"].as_str().unwrap()).unwrap();
    let example: toml::Value =
        toml::from_str(&std::fs::read_to_string(deploy().join("weft.example.toml")).unwrap())
            .unwrap();
    fn walk(a: &toml::Value, b: &toml::Value, at: &str) {
        for (k, v) in a.as_table().unwrap() {
            let e = b
                .get(k)
                .unwrap_or_else(|| panic!("weft.toml key {at}{k} is not in weft.example.toml"));
            if v.is_table() {
                walk(v, e, &format!("{at}{k}."));
            } else {
                assert_eq!(v.type_str(), e.type_str(), "{at}{k}");
            }
        }
    }
    walk(&ours, &example, "");
    assert!(
        ours.get("clickhouse")
            .and_then(|c| c.get("password"))
            .is_none(),
        "the password belongs in the Secret"
    );
}

#[test]
fn kafka_topic_settings_agree_with_the_script_and_weft() {
    let t = yaml_docs(&deploy().join("kafka/topics.yaml")).remove(0);
    let defaults = &t["defaults"];
    assert!(defaults["replication.factor"].as_u64().unwrap() >= 3);
    assert!(defaults["min.insync.replicas"].as_u64().unwrap() >= 2);
    assert!(
        defaults["min.insync.replicas"].as_u64() < defaults["replication.factor"].as_u64(),
        "min.insync.replicas must leave room for one broker down"
    );
    let mut yaml = BTreeMap::new();
    for topic in t["topics"].as_sequence().unwrap() {
        let name = topic["name"].as_str().unwrap().to_owned();
        let parts = topic["partitions"].as_u64().unwrap();
        let retention = topic["retention.ms"]
            .as_u64()
            .or(defaults["retention.ms"].as_u64())
            .unwrap();
        yaml.insert(name, (parts, retention));
    }
    // weft's own topic names.
    let topics = weft_schemas::Topics::default();
    let mut want: BTreeSet<String> = weft_schemas::Kind::ALL
        .iter()
        .map(|k| topics.topic(*k))
        .collect();
    want.insert(topics.dead_letter());
    assert_eq!(yaml.keys().cloned().collect::<BTreeSet<_>>(), want);
    // The script creates exactly these.
    let script = std::fs::read_to_string(deploy().join("kafka/create-topics.sh")).unwrap();
    let block = script
        .split("TOPICS=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap();
    let mut sh = BTreeMap::new();
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let w: Vec<&str> = line.split_whitespace().collect();
        sh.insert(
            format!("weaver.{}", w[0]),
            (w[1].parse::<u64>().unwrap(), w[2].parse::<u64>().unwrap()),
        );
    }
    assert_eq!(sh, yaml, "create-topics.sh and topics.yaml disagree");
    // The Strimzi form states the same.
    let strimzi = yaml_docs(&deploy().join("k8s/kafka-topics.yaml"));
    let mut st = BTreeMap::new();
    for o in &strimzi {
        assert_eq!(o["kind"], "KafkaTopic");
        st.insert(
            o["spec"]["topicName"].as_str().unwrap().to_owned(),
            (
                o["spec"]["partitions"].as_u64().unwrap(),
                o["spec"]["config"]["retention.ms"].as_u64().unwrap(),
            ),
        );
        assert_eq!(
            o["spec"]["config"]["min.insync.replicas"].as_u64(),
            defaults["min.insync.replicas"].as_u64()
        );
    }
    assert_eq!(st, yaml, "k8s/kafka-topics.yaml and topics.yaml disagree");
}

/// `CREATE TABLE|MATERIALIZED VIEW [IF NOT EXISTS] name` of a migration file.
fn created(sql: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for stmt in sql.split(";\n") {
        let code: String = stmt
            .lines()
            .map(|l| l.split("--").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let words: Vec<&str> = code.split_whitespace().collect();
        let Some(i) = words.iter().position(|w| *w == "CREATE") else {
            continue;
        };
        let what = if words[i + 1] == "TABLE" {
            "TABLE"
        } else {
            "VIEW"
        };
        out.push((what.to_owned(), code.clone()));
    }
    out
}

fn name_of(stmt: &str) -> String {
    let words: Vec<&str> = stmt.split_whitespace().collect();
    let i = words.iter().position(|w| *w == "CREATE").unwrap();
    let mut j = i + 1;
    while ["TABLE", "MATERIALIZED", "VIEW", "IF", "NOT", "EXISTS"].contains(&words[j]) {
        j += 1;
    }
    words[j].trim_matches('(').to_owned()
}

#[test]
fn clickhouse_cluster_migrations_cover_the_default_set() {
    let dir = deploy().join("clickhouse-cluster");
    let mut cluster: BTreeMap<String, String> = BTreeMap::new();
    let files = files(&dir, "sql");
    assert!(!files.is_empty());
    for f in &files {
        let sql = std::fs::read_to_string(f).unwrap();
        for (what, stmt) in created(&sql) {
            let name = name_of(&stmt);
            assert!(
                stmt.contains("ON CLUSTER '{cluster}'"),
                "{}: {name} is not created ON CLUSTER",
                f.display()
            );
            if what == "TABLE" {
                let engine = stmt
                    .split("ENGINE")
                    .nth(1)
                    .unwrap_or_else(|| panic!("{name}: no ENGINE"));
                let e = engine.trim_start_matches([' ', '=']).trim_start();
                assert!(
                    e.starts_with("Replicated") || e.starts_with("Distributed"),
                    "{name}: engine {} is neither replicated nor distributed",
                    e.lines().next().unwrap_or("")
                );
                if e.starts_with("Distributed") {
                    assert!(
                        e.contains(&format!("{name}_local")),
                        "{name} must distribute over {name}_local"
                    );
                    assert!(
                        cluster.contains_key(&format!("{name}_local")),
                        "{name}_local must be created before {name}"
                    );
                }
            }
            cluster.insert(name, stmt);
        }
    }
    // Every table and view of the default migrations exists under the same name, so the
    // binary's queries run unchanged against the cluster.
    for m in weft_schemas::migrations::all() {
        for stmt in m.statements() {
            if !stmt.contains("CREATE") {
                continue;
            }
            let name = name_of(&stmt);
            assert!(
                cluster.contains_key(&name),
                "migration {} creates {name}, which the cluster set lacks",
                m.version
            );
            if stmt.contains("CREATE TABLE") {
                assert!(
                    cluster[&name].contains("Distributed"),
                    "{name} must be a Distributed table on the cluster"
                );
            }
        }
    }
}

/// Every table of the default migrations has, in the cluster set, an `X_local` and a
/// Distributed `X` with the same columns in the same order, each with the same type, codec
/// and MATERIALIZED expression (read by `weft_store::ddl` from both sets of files).
#[test]
fn clickhouse_cluster_columns_match_the_migrations_one_by_one() {
    use weft_store::ddl;
    let default = ddl::tables(
        weft_schemas::migrations::all()
            .iter()
            .flat_map(|m| m.statements()),
    );
    let cluster = ddl::tables(
        files(&deploy().join("clickhouse-cluster"), "sql")
            .iter()
            .flat_map(|f| {
                let sql: &'static str =
                    Box::leak(std::fs::read_to_string(f).unwrap().into_boxed_str());
                weft_schemas::migrations::Migration {
                    version: 0,
                    name: String::new(),
                    sql,
                }
                .statements()
            }),
    );
    assert!(default.len() >= 12, "{:?}", default.keys());
    let shape = |cols: &[ddl::Column]| -> Vec<(String, String)> {
        cols.iter()
            .map(|c| (c.name.clone(), c.definition.clone()))
            .collect()
    };
    for (name, cols) in &default {
        for t in [format!("{name}_local"), name.clone()] {
            let there = cluster
                .get(&t)
                .unwrap_or_else(|| panic!("the cluster set lacks {t}"));
            assert_eq!(
                shape(there),
                shape(cols),
                "deploy/clickhouse-cluster: {t} differs from schemas/clickhouse: {name}"
            );
        }
    }
}

/// The cluster DDL parses: every statement through ClickHouse's own parser (`EXPLAIN AST`)
/// on the local stack. (Running it needs Keeper and a cluster, which are not here.)
#[tokio::test]
async fn clickhouse_cluster_ddl_parses() {
    let http = reqwest::Client::new();
    let mut n = 0;
    for f in files(&deploy().join("clickhouse-cluster"), "sql") {
        let sql = std::fs::read_to_string(&f).unwrap();
        for (_, stmt) in created(&sql) {
            let r = http
                .post(common::clickhouse_url())
                .body(format!("EXPLAIN AST {}", stmt.trim().trim_end_matches(';')))
                .send()
                .await
                .unwrap();
            let ok = r.status().is_success();
            let text = r.text().await.unwrap();
            assert!(ok, "{}: {text}\n{stmt}", f.display());
            n += 1;
        }
    }
    assert!(n >= 12, "only {n} statements");
}
