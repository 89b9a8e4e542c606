//! Definitions written as for the Humanitec Platform Orchestrator, run unchanged: Go templates
//! with Sprig functions, manifests per location, and Humanitec's Kubernetes drivers, checked
//! end to end through `gitplane apply` and `gitplane manifests` against golden files.

use crate::util::{Sandbox, assert_golden};

/// An in-cluster Redis in the style of Humanitec's resource packs: names derived from the
/// resource id and kept in the cookie, a Deployment, a Service and a Secret.
const REDIS: &str = r#"apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: redis-in-cluster
entity:
  name: redis-in-cluster
  type: redis
  driver_type: humanitec/template
  driver_inputs:
    values:
      resId: ${context.res.id}
      appId: ${context.app.id}
      templates:
        init: |-
          {{- if .cookie }}
          name: {{ .cookie.name }}
          {{- else }}
          {{- $parts := splitList "." .driver.values.resId }}
          name: redis-{{ index $parts 1 | substr 0 20 }}-{{ last $parts | lower | trunc 10 }}
          {{- end }}
          port: 6379
          labels: {{ dict "app" .driver.values.appId "component" "cache" | toRawJson }}
        manifests: |-
          deployment.yaml:
            location: namespace
            data:
              apiVersion: apps/v1
              kind: Deployment
              metadata:
                name: {{ .init.name }}
                labels: {{ .init.labels | toRawJson }}
              spec:
                selector:
                  matchLabels: {{ .init.labels | toRawJson }}
                template:
                  metadata:
                    labels: {{ .init.labels | toRawJson }}
                  spec:
                    containers:
                      - name: redis
                        image: {{ .driver.values.image | default "redis:7-alpine" | quote }}
                        args: ["--requirepass", "$(REDIS_PASSWORD)"]
                        env:
                          - name: REDIS_PASSWORD
                            valueFrom: {secretKeyRef: {name: {{ .init.name }}, key: password}}
          service.yaml:
            location: namespace
            data:
              apiVersion: v1
              kind: Service
              metadata:
                name: {{ .init.name }}
              spec:
                selector: {{ .init.labels | toRawJson }}
                ports:
                  - port: {{ .init.port }}
          secret.yaml:
            location: namespace
            data:
              apiVersion: v1
              kind: Secret
              metadata:
                name: {{ .init.name }}
              data:
                password: {{ .driver.secrets.password | b64enc }}
        outputs: |
          host: {{ .init.name }}
          port: {{ .init.port }}
        secrets: |
          password: {{ .driver.secrets.password | quote }}
        cookie: |
          name: {{ .init.name }}
    secrets:
      password: r3dis-s3cret-pw
  criteria:
    - {}
"#;

/// A log shipper every workload that asks for one gets as a sidecar, with its config volume.
const SHIPPER: &str = r#"apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: log-shipper
entity:
  type: log-shipper
  driver_type: humanitec/template
  driver_inputs:
    values:
      templates:
        manifests: |
          {{- $name := printf "%s-shipper" (.context.res.id | splitList "." | last) }}
          shipper.yaml:
            location: containers
            data:
              name: shipper
              image: fluent/fluent-bit:3.1
              args: {{ list "-c" "/etc/shipper/fluent-bit.conf" | toRawJson }}
              volumeMounts:
                - {name: {{ $name }}, mountPath: /etc/shipper}
          config-volume.yaml:
            location: volumes
            data:
              name: {{ $name }}
              configMap: {name: {{ $name }}}
          config.yaml:
            location: namespace
            data:
              apiVersion: v1
              kind: ConfigMap
              metadata: {name: {{ $name }}}
              data:
                fluent-bit.conf: |
                  [OUTPUT]
                      Name  stdout
                      Match {{ .context.app.id }}.*
  criteria:
    - {}
"#;

const VOLUME: &str = r#"apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: data-volume
entity:
  type: volume
  driver_type: humanitec/volume-pvc
  driver_inputs:
    values:
      access_modes: ReadWriteOnce
      capacity: 5Gi
      storage_class_name: standard
  criteria:
    - {}
"#;

const HPA: &str = r#"apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: hpa
entity:
  type: horizontal-pod-autoscaler
  driver_type: humanitec/hpa
  driver_inputs:
    values:
      minReplicas: 2
      maxReplicas: 6
      targetCPUUtilizationPercentage: 70
  criteria:
    - {}
"#;

fn platform() -> Sandbox {
    let sb = Sandbox::new();
    sb.seed_template();
    sb.remove("definitions/redis.yaml");
    sb.write("definitions/redis.yaml", REDIS);
    sb.write("definitions/log-shipper.yaml", SHIPPER);
    sb.write("definitions/volume.yaml", VOLUME);
    sb.write("definitions/hpa.yaml", HPA);
    sb.edit(
        "workloads/shop/backend.yaml",
        "resources:\n",
        "resources:\n  logs:\n    type: log-shipper\n  data:\n    type: volume\n  \
         scaling:\n    type: horizontal-pod-autoscaler\n",
    );
    sb.commit("Humanitec-style definitions");
    sb
}

#[test]
fn go_templates_and_kubernetes_drivers_render_the_deployments_manifests() {
    let sb = platform();
    sb.gitplane(&["apply", "--env", "development"]).ok();
    // The Go templates' outputs and secret outputs are the resource's.
    let outputs = sb.outputs("development", "shared.cache");
    assert_eq!(outputs["host"], "redis-cache-cache");
    assert_eq!(outputs["port"], 6379);
    let run = sb
        .gitplane(&["manifests", "--env", "development", "--app", "shop"])
        .ok();
    run.hides(&["r3dis-s3cret-pw", "cjNkaXMtczNjcmV0LXB3"]);
    assert_golden("hpo-development.yaml", &run.stdout);
    sb.assert_state_bytes_hide(&["r3dis-s3cret-pw", "cjNkaXMtczNjcmV0LXB3"]);
    // The sealed copy holds the Secret's real data (the password, base64-encoded).
    let shown = sb
        .gitplane(&["manifests", "--env", "development", "--show-secrets"])
        .ok();
    assert!(shown.stdout.contains("password: cjNkaXMtczNjcmV0LXB3"));
}

#[test]
fn the_init_names_are_kept_in_the_cookie_across_updates() {
    let sb = platform();
    sb.gitplane(&["apply", "--env", "development"]).ok();
    // A new image re-renders everything, but the names come from the cookie.
    sb.edit(
        "definitions/redis.yaml",
        "      resId: ${context.res.id}\n",
        "      resId: ${context.res.id}\n      image: redis:7.4\n",
    );
    sb.commit("Redis 7.4");
    sb.gitplane(&["apply", "--env", "development"])
        .ok()
        .stdout_has("updated");
    let run = sb.gitplane(&["manifests", "--env", "development"]).ok();
    assert!(run.stdout.contains("image: redis:7.4"));
    assert!(run.stdout.contains("name: redis-cache-cache"));
}

#[test]
fn a_template_error_fails_the_resource_with_the_templates_name_and_line() {
    let sb = platform();
    sb.edit(
        "definitions/redis.yaml",
        "          host: {{ .init.name }}\n",
        "          host: {{ .init.name | nosuchfunction }}\n",
    );
    sb.commit("A typo");
    let run = sb.gitplane(&["apply", "--env", "development"]).fails();
    run.stderr_has("values.templates.outputs");
    run.stderr_has("nosuchfunction");
    run.hides(&["r3dis-s3cret-pw"]);
}
