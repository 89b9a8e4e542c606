//! Choosing a definition beyond criteria: label selectors, an explicit definition (classRef),
//! and the type's default definition. Never random: criteria specificity, then weight, then id.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::matching::{MatchContext, NoMatch, match_definition};
use crate::model::template::Template;
use crate::model::{Choice, Criterion, DEFAULT_CLASS, Definition, SourceLocation};

/// The definition serving a request, or why none does: the closest candidates.
pub fn choose<'d>(
    of_type: &[&'d Definition],
    by_id: &BTreeMap<&str, &'d Definition>,
    ctx: &MatchContext<'_>,
    choice: &Choice,
) -> Result<&'d Definition, NoMatch> {
    match choice {
        Choice::Criteria | Choice::Resource(_) | Choice::Interface(_) => {
            match match_definition(of_type, ctx) {
                Ok(def) => Ok(def),
                Err(no) if ctx.class == DEFAULT_CLASS => {
                    // With no class and no selector, the type's default definition serves.
                    of_type.iter().copied().find(|d| d.default).ok_or(no)
                }
                Err(no) => Err(no),
            }
        }
        Choice::Definition(id) => match by_id.get(id.as_str()) {
            Some(def) if def.res_type == ctx.res_type => Ok(def),
            Some(def) => Err(NoMatch {
                candidates: vec![format!(
                    "{id} (class-ref: it provisions type '{}', not '{}')",
                    def.res_type, ctx.res_type
                )],
            }),
            None => Err(NoMatch {
                candidates: vec![format!("{id} (class-ref: no definition has this id)")],
            }),
        },
        Choice::Labels(selector) => by_labels(of_type, ctx, selector),
    }
}

/// How well a definition fits a label selector: `None` when it does not; else its rank key
/// (criteria specificity, weight, and the id reversed so that smaller ids win).
fn fit(
    def: &Definition,
    ctx: &MatchContext<'_>,
    selector: &BTreeMap<String, String>,
) -> Option<(u8, i64)> {
    if !selector.iter().all(|(k, v)| def.labels.get(k) == Some(v)) {
        return None;
    }
    // A selector chooses instead of a class: rules are checked on everything but the class,
    // and a definition without criteria (a pure class, as in Crossplane) fits anywhere.
    if def.criteria.is_empty() {
        return Some((0, def.weight));
    }
    def.criteria
        .iter()
        .filter(|rule| {
            let unclassed = Criterion {
                class: ctx.class.to_owned(),
                ..(*rule).clone()
            };
            match_definition(&[&single(def, unclassed)], ctx).is_ok()
        })
        .map(|rule| (specificity(rule), def.weight))
        .max()
}

fn specificity(rule: &Criterion) -> u8 {
    (rule.res_id.is_some() as u8) << 3
        | (rule.env_id.is_some() as u8) << 2
        | (rule.app_id.is_some() as u8) << 1
        | rule.env_type.is_some() as u8
}

/// A copy of `def` with one rule, to reuse criteria matching on a rule alone.
fn single(def: &Definition, rule: Criterion) -> Definition {
    Definition {
        criteria: vec![rule],
        values: Template::default(),
        secrets: Template::default(),
        provision: Vec::new(),
        depends_on: Vec::new(),
        ..def.clone()
    }
}

fn by_labels<'d>(
    of_type: &[&'d Definition],
    ctx: &MatchContext<'_>,
    selector: &BTreeMap<String, String>,
) -> Result<&'d Definition, NoMatch> {
    let mut fits: Vec<((u8, i64), &'d Definition)> = of_type
        .iter()
        .filter_map(|d| fit(d, ctx, selector).map(|k| (k, *d)))
        .collect();
    // Most specific, then heaviest, then the smallest id.
    fits.sort_by(|(ka, a), (kb, b)| kb.cmp(ka).then_with(|| a.id.cmp(&b.id)));
    if let Some((_, def)) = fits.first() {
        return Ok(def);
    }
    let wanted: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    Err(NoMatch {
        candidates: of_type
            .iter()
            .take(3)
            .map(|d| {
                let labels: Vec<String> =
                    d.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!(
                    "{} (labels {{{}}}, the selector wants {})",
                    d.id,
                    labels.join(", "),
                    wanted.join(",")
                )
            })
            .collect(),
    })
}

/// Every definition of the type with how it fares against `choice`: for `explain`.
/// Each entry: definition id, whether it serves, and why.
pub fn candidates(
    of_type: &[&Definition],
    by_id: &BTreeMap<&str, &Definition>,
    ctx: &MatchContext<'_>,
    choice: &Choice,
) -> Vec<(String, bool, String)> {
    let winner = choose(of_type, by_id, ctx, choice)
        .ok()
        .map(|d| d.id.clone());
    let mut out: Vec<(String, bool, String)> = of_type
        .iter()
        .map(|d| {
            let won = winner.as_deref() == Some(d.id.as_str());
            let why = match choice {
                Choice::Labels(sel) => match fit(d, ctx, sel) {
                    Some((spec, weight)) if won => {
                        format!("labels fit; specificity {spec}, weight {weight}: the best")
                    }
                    Some((spec, weight)) => format!(
                        "labels fit, but specificity {spec} and weight {weight} rank below the winner (or its id sorts after)"
                    ),
                    None => "its labels do not carry the selector's".to_owned(),
                },
                Choice::Definition(id) if *id == d.id => "named by class-ref".to_owned(),
                Choice::Definition(_) => "class-ref names another definition".to_owned(),
                _ if won && d.default && match_definition(&[*d], ctx).is_err() => {
                    "no criteria match: the type's default definition serves".to_owned()
                }
                _ if won => "its rule is the most specific match".to_owned(),
                _ => match match_definition(&[*d], ctx) {
                    Ok(_) => "matches, but a more specific rule wins".to_owned(),
                    Err(no) => no.candidates.first().cloned().unwrap_or_default(),
                },
            };
            (d.id.clone(), won, why)
        })
        .collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

/// The definition a user-provided resource stands on: no driver call, no deletion; its outputs
/// are what the environment file gives.
pub fn provided_definition(
    name: &str,
    res_type: &str,
    outputs: &serde_json::Value,
    at: &SourceLocation,
) -> Definition {
    Definition {
        id: format!("provided/{name}"),
        name: name.to_owned(),
        res_type: res_type.to_owned(),
        driver_type: crate::PROVIDED_DRIVER.to_owned(),
        driver_account: None,
        deletion_policy: crate::records::DeletionPolicy::Orphan,
        auto_update: true,
        depends_on: Vec::new(),
        labels: BTreeMap::new(),
        weight: 0,
        default: false,
        provides: BTreeMap::new(),
        values: Template::Value(outputs.clone()),
        secrets: Template::default(),
        provision: Vec::new(),
        criteria: Vec::new(),
        location: at.clone(),
        source: Arc::from(""),
        line_offset: 0,
    }
}
