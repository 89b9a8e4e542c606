//! The repository the benches generate: N apps, each one workload with a private postgres that
//! reads the app's base-env, a private redis and an app-shared dns (five resources per app with
//! the implicit base-env), with the built-in echo driver.

use std::collections::BTreeMap;

/// The definitions of the five resource types, in one file.
pub fn definitions() -> String {
    let definition = |id: &str, res_type: &str, values: &str| {
        format!(
            "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: {id}\nentity:\n  \
             type: {res_type}\n  driver_type: humanitec/echo\n  driver_inputs:\n    values:\n{values}  \
             criteria:\n    - {{}}\n"
        )
    };
    [
        definition(
            "base-env",
            "base-env",
            "      pghost: db.internal\n      pgport: 5432\n",
        ),
        definition(
            "postgres",
            "postgres",
            "      host: ${resources.base-env#base-env.outputs.pghost}\n      port: ${resources.base-env#base-env.outputs.pgport}\n      name: ${context.app.id}\n",
        ),
        definition("redis", "redis", "      host: redis.internal\n"),
        definition("dns", "dns", "      host: ${context.app.id}.example.com\n"),
        definition("workload", "workload", "      namespace: ${context.app.id}\n"),
    ]
    .join("---\n")
}

/// An app's Score file; `tag` is its image tag (1 in the generated repository).
pub fn workload(tag: usize) -> String {
    format!(
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    image: \
         registry.example.com/web:{tag}\n    variables:\n      DB: postgres://${{resources.db.host}}:${{resources.db.port}}/${{resources.db.name}}\n      \
         CACHE: ${{resources.cache.host}}\n      HOST: ${{resources.dns.host}}\nresources:\n  db:\n    type: postgres\n  cache:\n    \
         type: redis\n  dns:\n    type: dns\n    id: dns\n"
    )
}

/// Where app `app`'s Score file lives.
pub fn workload_path(app: usize) -> String {
    format!("workloads/app-{app:05}/web.yaml")
}

/// Every file of a repository of `apps` apps, by path.
pub fn repository(apps: usize) -> BTreeMap<String, String> {
    let mut files = BTreeMap::new();
    files.insert(
        "environments/development.yaml".to_owned(),
        "type: development\n".to_owned(),
    );
    files.insert("definitions/platform.yaml".to_owned(), definitions());
    for i in 0..apps {
        files.insert(workload_path(i), workload(1));
    }
    files
}
