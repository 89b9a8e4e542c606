#!/usr/bin/env bash
# Side by side with Terraform: first apply and no-op of the same 1 000-resource graph (200 apps).
#
# The graph is that of daemon/benches/graph.rs and daemon/benches/scale.rs: per app a base-env, a
# postgres reading the base-env's pghost and pgport, a redis, a dns and a workload reading the
# postgres, redis and dns outputs (5 resources, 4 reference edges per app). gitplane applies it
# with the built-in echo driver; Terraform applies it as `terraform_data` resources (the built-in
# `terraform` provider: nothing to download). Each figure is the median of 3 wall-clock runs.
#
#   bash bench/terraform.sh               # 200 apps = 1 000 resources
#   APPS=50 GITPLANE=target/release/gitplane bash bench/terraform.sh
#
# Skips (exit 0) when `terraform` is not on PATH.
set -euo pipefail

APPS=${APPS:-200}
RUNS=3
RESOURCES=$((APPS * 5))

if ! command -v terraform > /dev/null 2>&1; then
    echo "terraform is not on PATH: skipping the Terraform side-by-side"
    exit 0
fi

root="$(cd "$(dirname "$0")/.." && pwd)"
if [[ -z "${GITPLANE:-}" ]]; then
    (cd "$root" && cargo build --release -q)
    GITPLANE="${CARGO_TARGET_DIR:-$root/target}/release/gitplane"
fi
GITPLANE="$(realpath "$GITPLANE")"
[[ -x "$GITPLANE" ]] || { echo "no gitplane binary at $GITPLANE" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Terraform: no telemetry, no prompts, every file in the temp dir (and an empty CLI config, so
# nothing from the host's config applies).
export TF_IN_AUTOMATION=1 CHECKPOINT_DISABLE=1
export TF_CLI_CONFIG_FILE="$tmp/terraformrc" TF_DATA_DIR="$tmp/tf/.terraform"
unset TF_PLUGIN_CACHE_DIR TF_LOG TF_WORKSPACE
: > "$TF_CLI_CONFIG_FILE"
# git: isolated from the user's and the system's configuration.
export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1
export GITPLANE_LOG=warn

app_id() { printf 'app-%05d' "$1"; }

# --- the gitplane repository ------------------------------------------------------------------
repo="$tmp/repo"
mkdir -p "$repo/environments" "$repo/definitions"
printf 'type: development\n' > "$repo/environments/development.yaml"
definition() { # ID TYPE VALUES
    printf 'apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: %s\nentity:\n  type: %s\n  driver_type: humanitec/echo\n  driver_inputs:\n    values:\n%s  criteria:\n    - {}\n' "$1" "$2" "$3"
}
{
    definition base-env base-env $'      pghost: db.internal\n      pgport: 5432\n'
    echo ---
    definition postgres postgres $'      host: ${resources.base-env#base-env.outputs.pghost}\n      port: ${resources.base-env#base-env.outputs.pgport}\n      name: ${context.app.id}\n'
    echo ---
    definition redis redis $'      host: redis.internal\n'
    echo ---
    definition dns dns $'      host: ${context.app.id}.example.com\n'
    echo ---
    definition workload workload $'      namespace: ${context.app.id}\n'
} > "$repo/definitions/platform.yaml"
workload='apiVersion: score.dev/v1b1
metadata:
  name: web
containers:
  main:
    image: registry.example.com/web:1
    variables:
      DB: postgres://${resources.db.host}:${resources.db.port}/${resources.db.name}
      CACHE: ${resources.cache.host}
      HOST: ${resources.dns.host}
resources:
  db:
    type: postgres
  cache:
    type: redis
  dns:
    type: dns
    id: dns
'
for ((i = 0; i < APPS; i++)); do
    dir="$repo/workloads/$(app_id "$i")"
    mkdir -p "$dir"
    printf '%s' "$workload" > "$dir/web.yaml"
done
git -C "$repo" init -q --initial-branch=main
git -C "$repo" add -A
git -C "$repo" -c user.name=gitplane-bench -c user.email=bench@gitplane.invalid \
    commit -q -m "$APPS apps"

# --- the same graph for Terraform ---------------------------------------------------------------
# Explicit resources, five per app, rather than for_each: Terraform draws its dependency edges
# between resource blocks, so with for_each every postgres would wait for every base-env. With
# one block per resource the edges are exactly gitplane's: workload -> postgres, redis, dns;
# postgres -> base-env.
tf="$tmp/tf"
mkdir -p "$tf"
for ((i = 0; i < APPS; i++)); do
    n=$(printf '%05d' "$i")
    app=$(app_id "$i")
    cat << EOF
resource "terraform_data" "base_env_$n" {
  input = { pghost = "db.internal", pgport = 5432 }
}
resource "terraform_data" "postgres_$n" {
  input = {
    host = terraform_data.base_env_$n.output.pghost
    port = terraform_data.base_env_$n.output.pgport
    name = "$app"
  }
}
resource "terraform_data" "redis_$n" {
  input = { host = "redis.internal" }
}
resource "terraform_data" "dns_$n" {
  input = { host = "$app.example.com" }
}
resource "terraform_data" "workload_$n" {
  input = {
    namespace = "$app"
    image     = "registry.example.com/web:1"
    DB        = "postgres://\${terraform_data.postgres_$n.output.host}:\${terraform_data.postgres_$n.output.port}/\${terraform_data.postgres_$n.output.name}"
    CACHE     = terraform_data.redis_$n.output.host
    HOST      = terraform_data.dns_$n.output.host
  }
}
EOF
done > "$tf/main.tf"

# --- running and timing -------------------------------------------------------------------------
out="$tmp/out.txt"
err="$tmp/err.txt"

# run DESCRIPTION COMMAND...: runs it with output to files; on failure shows both and exits.
run() {
    local what="$1"
    shift
    if ! "$@" > "$out" 2> "$err"; then
        echo "FAILED: $what: $*" >&2
        echo "--- stdout ---" >&2
        tail -n 60 "$out" >&2
        echo "--- stderr ---" >&2
        tail -n 60 "$err" >&2
        exit 1
    fi
}
# expect DESCRIPTION TEXT: the last command's stdout contains TEXT.
expect() {
    if ! grep -qF -- "$2" "$out"; then
        echo "FAILED: $1: its output does not say \"$2\"" >&2
        tail -n 60 "$out" >&2
        exit 1
    fi
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
fmt() { awk -v s="$1" 'BEGIN { if (s < 1) printf "%.0f ms", s * 1000; else printf "%.2f s", s }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1fx", a / b }'; }

echo "$APPS apps, $RESOURCES resources; $(terraform version | head -n 1); gitplane at $GITPLANE"
run "terraform init" terraform -chdir="$tf" init -input=false -no-color

tf_apply=()
for ((r = 1; r <= RUNS; r++)); do
    rm -f "$tf/terraform.tfstate" "$tf/terraform.tfstate.backup"
    t=$(now)
    run "terraform apply (run $r)" \
        terraform -chdir="$tf" apply -auto-approve -parallelism=64 -input=false -no-color
    tf_apply+=("$(since "$t")")
    expect "terraform apply" "Resources: $RESOURCES added, 0 changed, 0 destroyed."
done
tf_plan=()
for ((r = 1; r <= RUNS; r++)); do
    t=$(now)
    # -detailed-exitcode: 0 only when there is nothing to change.
    run "terraform plan (run $r)" \
        terraform -chdir="$tf" plan -refresh=false -detailed-exitcode -input=false -no-color
    tf_plan+=("$(since "$t")")
    expect "terraform plan" "No changes."
done

gp_apply=()
for ((r = 1; r <= RUNS; r++)); do
    state="$tmp/state-$r.db"
    t=$(now)
    run "gitplane apply (run $r)" "$GITPLANE" apply --repo "$repo" --state "$state"
    gp_apply+=("$(since "$t")")
    expect "gitplane apply" "development: deployment 1 succeeded: $RESOURCES created, 0 updated, 0 deleted"
done
gp_noop=()
for ((r = 1; r <= RUNS; r++)); do
    t=$(now)
    run "gitplane no-op apply (run $r)" "$GITPLANE" apply --repo "$repo" --state "$tmp/state-$RUNS.db"
    gp_noop+=("$(since "$t")")
    expect "gitplane no-op apply" "0 created, 0 updated, 0 deleted, $RESOURCES unchanged, 0 failed"
done

tf_a=$(median "${tf_apply[@]}")
tf_p=$(median "${tf_plan[@]}")
gp_a=$(median "${gp_apply[@]}")
gp_n=$(median "${gp_noop[@]}")
echo
echo "Median of $RUNS wall-clock runs, $APPS apps = $RESOURCES resources:"
echo
echo "| | Terraform | gitplane |"
echo "|---|---:|---:|"
echo "| first apply (empty state) | $(fmt "$tf_a") (\`apply -auto-approve -parallelism=64\`) | $(fmt "$gp_a") (\`apply\`) |"
echo "| no-op | $(fmt "$tf_p") (\`plan -refresh=false\`) | $(fmt "$gp_n") (\`apply\`, nothing to do) |"
echo
echo "runs (s): terraform apply ${tf_apply[*]}; terraform plan ${tf_plan[*]}; gitplane apply ${gp_apply[*]}; gitplane no-op apply ${gp_noop[*]}"
echo
echo "first apply: terraform / gitplane = $(ratio "$tf_a" "$gp_a")"
echo "no-op: terraform plan -refresh=false / gitplane no-op apply = $(ratio "$tf_p" "$gp_n")"
