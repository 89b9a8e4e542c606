//! `gitplane manifests`: the Kubernetes manifests an environment's deployment applies, as a
//! stream `kubectl apply -f -` takes, from what the last apply recorded.

use std::collections::BTreeSet;
use std::io::Write;

use clap::ValueEnum;
use serde_json::{Value, json};

use super::{CliError, CommandResult, Context, existing_store};
use crate::drivers::ManifestLocation;
use crate::manifests::{self, Object};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ManifestFormat {
    /// A YAML stream, one document per object.
    Yaml,
    /// One Kubernetes `List` object.
    Json,
}

pub(crate) fn manifests(
    ctx: &Context,
    apps: &[String],
    format: ManifestFormat,
    show_secrets: bool,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let store = existing_store(ctx)?;
    let known = store.environments()?;
    let env = match ctx.envs.as_slice() {
        [env] => env,
        [] => return Err(CliError::OneEnv("no --env".to_owned())),
        several => {
            return Err(CliError::OneEnv(format!(
                "--env {}",
                several.join(" --env ")
            )));
        }
    };
    if !known.contains(env) {
        return Err(crate::app::AppError::UnknownStateEnv {
            env: env.clone(),
            state: ctx.state.clone(),
            known: known.join(", "),
        }
        .into());
    }
    let resources = store.resources_without_secrets(env)?;
    let recorded_apps: BTreeSet<&str> = resources.iter().filter_map(|r| r.app.as_deref()).collect();
    if let Some(app) = apps.iter().find(|a| !recorded_apps.contains(a.as_str())) {
        return Err(CliError::UnknownApp {
            app: app.clone(),
            env: env.clone(),
            known: recorded_apps.into_iter().collect::<Vec<_>>().join(", "),
        });
    }
    let links = store.links(env)?;
    let recorded = store.manifests(env, show_secrets)?;
    let apps: BTreeSet<String> = apps.iter().cloned().collect();
    let deployment = manifests::deployment(&resources, &links, &recorded, &apps);
    for why in &deployment.unplaced {
        eprintln!("note: {why}");
    }
    match format {
        ManifestFormat::Yaml => {
            for object in &deployment.objects {
                let text = serde_saphyr::to_string(&object.data).map_err(|e| {
                    CliError::Output(std::io::Error::other(format!(
                        "cannot write {} as YAML: {e}",
                        source(object)
                    )))
                })?;
                writeln!(stdout, "---\n# {}", source(object))?;
                write!(stdout, "{text}")?;
                if !text.ends_with('\n') {
                    writeln!(stdout)?;
                }
            }
        }
        ManifestFormat::Json => {
            let items: Vec<&Value> = deployment.objects.iter().map(|o| &o.data).collect();
            let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
            let text =
                serde_json::to_string_pretty(&list).expect("a serde_json::Value always serialises");
            writeln!(stdout, "{text}")?;
        }
    }
    Ok(CommandResult::Success)
}

/// Where an object comes from, for the comment above it: `app/res_id (type): name`.
fn source(object: &Object) -> String {
    let location = match object.location {
        ManifestLocation::Cluster => " [cluster]",
        _ => "",
    };
    match &object.app {
        Some(app) => format!(
            "{app}/{} ({}): {}{location}",
            object.res_id, object.res_type, object.name
        ),
        None => format!(
            "{} ({}): {}{location}",
            object.res_id, object.res_type, object.name
        ),
    }
}
