//! Score `files` and `volumes` in the generated Deployment: files as a ConfigMap (a Secret when
//! the content holds a secret) mounted at their targets, volumes as mounts of the pod volume
//! their resource gives; a `files[].source` the commit does not hold is refused at load.

use serde_json::Value;

use crate::util::Sandbox;

/// The template's database password, which the secret file below reads.
const PASSWORD: &str = "dev-password-change-me";

/// A web server in the shape of score-spec's full sample: files from the repository, inline
/// and verbatim, a persistent volume with a sub-path and a scratch volume.
const WEB: &str = r#"apiVersion: score.dev/v1b1
metadata:
  name: web
containers:
  main:
    image: nginx:1.27
    files:
      /etc/nginx/conf.d/default.conf:
        mode: "0640"
        source: config/default.conf
      /run/secrets/db.env:
        content: |
          DB_PASSWORD=${resources.db.password}
      /usr/share/nginx/html/index.html:
        noExpand: true
        content: "<p>${not a placeholder}</p>"
    volumes:
      /var/cache/nginx:
        source: ${resources.scratch}
      /data:
        source: ${resources.data}
        path: uploads
        readOnly: true
      /var/log/web:
        source: ${resources.logs}
resources:
  logs:
    type: volume
    class: plain
  db:
    type: postgres
  data:
    type: volume
  scratch:
    type: volume
    class: ephemeral
"#;

const CONFIG: &str = "server {\n  server_name ${metadata.name}.example.com;\n}\n";

/// A claim through Humanitec's volume-pvc driver, and an emptyDir through a template, as in
/// Humanitec's example library.
const VOLUMES: &str = r#"apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: data-volume
entity:
  type: volume
  driver_type: humanitec/volume-pvc
  driver_inputs:
    values:
      capacity: 1Gi
  criteria:
    - {}
---
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: volume-emptydir
entity:
  type: volume
  driver_type: humanitec/template
  driver_inputs:
    values:
      templates:
        manifests: |
          emptydir.yaml:
            location: volumes
            data:
              name: {{ .id | splitList "." | last }}-emptydir
              emptyDir:
                sizeLimit: 64Mi
  criteria:
    - class: ephemeral
---
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: volume-without-pod-volume
entity:
  type: volume
  driver_type: humanitec/echo
  driver_inputs:
    values:
      note: gives no manifest in location volumes
  criteria:
    - class: plain
"#;

fn web_repo() -> Sandbox {
    let sb = Sandbox::new();
    sb.seed_template();
    sb.write("definitions/volumes.yaml", VOLUMES);
    sb.write("workloads/site/web.yaml", WEB);
    sb.write("workloads/site/config/default.conf", CONFIG);
    sb.commit("web with files and volumes");
    sb
}

/// The objects `gitplane manifests` prints for app `site`.
fn site_objects(sb: &Sandbox, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["manifests", "--env", "development", "--app", "site"];
    args.extend(extra);
    args.extend(["--format", "json"]);
    let json = sb.gitplane(&args).ok().json();
    json["items"].as_array().expect("a List").clone()
}

fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {objects:#?}"))
}

/// The pod volume a mount at `target` of the first container uses.
fn volume_at<'a>(deployment: &'a Value, target: &str) -> (&'a Value, &'a Value) {
    let pod = &deployment["spec"]["template"]["spec"];
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == target)
        .unwrap_or_else(|| panic!("no mount at {target}: {pod:#}"));
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("no pod volume for {mount}: {pod:#}"));
    (mount, volume)
}

#[test]
fn score_files_and_volumes_are_mounted_in_the_generated_deployment() {
    let sb = web_repo();
    sb.gitplane(&["apply", "--env", "development"]).ok();
    let run = sb
        .gitplane(&["manifests", "--env", "development", "--app", "site"])
        .ok();
    run.hides(&[PASSWORD]);
    sb.assert_state_bytes_hide(&[PASSWORD]);
    // A volume resource that gives no pod volume cannot be mounted, and that is said.
    run.stderr_has(
        "note: workload site/workload.default#modules.web mounts \
         site/volume.plain#modules.web.externals.logs at /var/log/web, which gives no pod volume",
    );
    let objects = site_objects(&sb, &[]);
    let deployment = object(&objects, "Deployment", "web");

    // A file from the repository, placeholders expanded, with its mode.
    let (mount, volume) = volume_at(deployment, "/etc/nginx/conf.d/default.conf");
    assert_eq!(mount["readOnly"], true);
    let item = &volume["configMap"]["items"][0];
    assert_eq!(volume["configMap"]["name"], "web-files");
    assert_eq!(item["mode"], 0o640);
    assert_eq!(mount["subPath"], item["path"]);
    let config = object(&objects, "ConfigMap", "web-files");
    let key = item["key"].as_str().unwrap();
    assert_eq!(
        config["data"][key],
        "server {\n  server_name web.example.com;\n}\n"
    );
    // `noExpand`: as written.
    let (_, volume) = volume_at(deployment, "/usr/share/nginx/html/index.html");
    let key = volume["configMap"]["items"][0]["key"].as_str().unwrap();
    assert_eq!(config["data"][key], "<p>${not a placeholder}</p>");
    // A file that reads a secret is a Secret's, hidden unless asked for.
    let (_, volume) = volume_at(deployment, "/run/secrets/db.env");
    assert_eq!(volume["secret"]["secretName"], "web-secret-files");
    let key = volume["secret"]["items"][0]["key"].as_str().unwrap();
    assert_eq!(
        object(&objects, "Secret", "web-secret-files")["stringData"][key],
        "(secret)"
    );
    let shown = site_objects(&sb, &["--show-secrets"]);
    assert_eq!(
        object(&shown, "Secret", "web-secret-files")["stringData"][key],
        format!("DB_PASSWORD={PASSWORD}\n")
    );

    // Volumes: the pod volume each volume resource gives, mounted at the target.
    let (mount, volume) = volume_at(deployment, "/data");
    assert_eq!(mount["subPath"], "uploads");
    assert_eq!(mount["readOnly"], true);
    let claim = volume["persistentVolumeClaim"]["claimName"]
        .as_str()
        .unwrap();
    object(&objects, "PersistentVolumeClaim", claim);
    let (mount, volume) = volume_at(deployment, "/var/cache/nginx");
    assert!(mount.get("readOnly").is_none(), "{mount}");
    assert_eq!(volume["emptyDir"]["sizeLimit"], "64Mi");
    let mounts = &deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"];
    assert!(
        !mounts.to_string().contains("/var/log/web"),
        "no mount without a pod volume: {mounts}"
    );

    // A change to the source file alone reaches the ConfigMap.
    sb.write(
        "workloads/site/config/default.conf",
        "server { listen 8080; }\n",
    );
    sb.commit("listen on 8080");
    sb.gitplane(&["apply", "--env", "development"]).ok();
    let objects = site_objects(&sb, &[]);
    let config = object(&objects, "ConfigMap", "web-files");
    assert!(
        config["data"]
            .as_object()
            .unwrap()
            .values()
            .any(|v| v == "server { listen 8080; }\n"),
        "{config:#}"
    );
}

#[test]
fn a_files_source_missing_from_the_commit_is_refused_with_its_line() {
    let sb = web_repo();
    sb.gitplane(&["apply", "--env", "development"]).ok();
    let before = sb.resource_rows();
    sb.remove("workloads/site/config/default.conf");
    sb.edit(
        "workloads/site/web.yaml",
        "/usr/share/nginx/html/index.html:",
        "/etc/motd:\n        source: ../../../motd\n      /usr/share/nginx/html/index.html:",
    );
    sb.commit("config moved away");
    for command in ["validate", "apply"] {
        let run = sb.gitplane(&[command]).fails();
        run.stderr_has(
            "workloads/site/web.yaml:10:9: files source names workloads/site/config/default.conf, \
             which is not in the repository",
        );
        run.stderr_has(
            "workloads/site/web.yaml:15:9: files source '../../../motd' is outside \
             workloads/site/",
        );
    }
    assert_eq!(sb.resource_rows(), before, "state unchanged");
}
