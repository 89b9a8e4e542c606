//! Matching a resource to one Resource Definition by criteria (docs/repository.md, section 5).

use std::fmt;

use crate::model::{Criterion, Definition};

/// What a rule is compared against.
#[derive(Debug, Clone, Copy)]
pub struct MatchContext<'a> {
    pub app_id: Option<&'a str>,
    pub env_id: &'a str,
    pub env_type: &'a str,
    pub res_type: &'a str,
    pub class: &'a str,
    pub res_id: &'a str,
}

impl fmt::Display for MatchContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "app_id: {}, env_id: {}, env_type: {}, res_id: {}, class: {}",
            self.app_id.unwrap_or("-"),
            self.env_id,
            self.env_type,
            self.res_id,
            self.class
        )
    }
}

/// No definition of the type matches; the closest candidates say what failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoMatch {
    /// `"def-id (env_type is development, the rule wants production)"`, closest first.
    pub candidates: Vec<String>,
}

/// How specific a rule is: fields compared in the order res_id, env_id, app_id, env_type.
type Specificity = (bool, bool, bool, bool);

fn specificity(rule: &Criterion) -> Specificity {
    (
        rule.res_id.is_some(),
        rule.env_id.is_some(),
        rule.app_id.is_some(),
        rule.env_type.is_some(),
    )
}

/// The fields of `rule` that `ctx` fails, as `(field, resource's value, rule's value)`.
fn mismatches<'a>(
    rule: &'a Criterion,
    ctx: &MatchContext<'a>,
) -> Vec<(&'static str, String, &'a str)> {
    let mut out = Vec::new();
    let mut check = |name: &'static str, want: Option<&'a str>, have: Option<&str>| {
        if let Some(want) = want
            && have != Some(want)
        {
            out.push((name, have.unwrap_or("none").to_owned(), want));
        }
    };
    check("res_id", rule.res_id.as_deref(), Some(ctx.res_id));
    check("env_id", rule.env_id.as_deref(), Some(ctx.env_id));
    check("app_id", rule.app_id.as_deref(), ctx.app_id);
    check("env_type", rule.env_type.as_deref(), Some(ctx.env_type));
    check("class", Some(rule.class.as_str()), Some(ctx.class));
    out
}

/// Picks the definition whose matching rule is most specific.
///
/// `definitions` must all be of `ctx.res_type`. Equal rules across definitions are rejected at
/// load time, so two matching rules of equal specificity cannot occur; the definition id breaks
/// the tie anyway so the choice never depends on file order.
pub fn match_definition<'d>(
    definitions: &[&'d Definition],
    ctx: &MatchContext<'_>,
) -> Result<&'d Definition, NoMatch> {
    let mut best: Option<(Specificity, &'d Definition)> = None;
    for def in definitions {
        for rule in &def.criteria {
            if !mismatches(rule, ctx).is_empty() {
                continue;
            }
            let s = specificity(rule);
            let better = match best {
                None => true,
                Some((bs, bd)) => s > bs || (s == bs && def.id < bd.id),
            };
            if better {
                best = Some((s, def));
            }
        }
    }
    if let Some((_, def)) = best {
        return Ok(def);
    }
    let mut candidates: Vec<(usize, String)> = definitions
        .iter()
        .filter_map(|def| {
            def.criteria
                .iter()
                .map(|rule| {
                    let miss = mismatches(rule, ctx);
                    let why = miss
                        .iter()
                        .map(|(f, have, want)| format!("{f} is {have}, the rule wants {want}"))
                        .collect::<Vec<_>>()
                        .join("; ");
                    (miss.len(), format!("{} ({why})", def.id))
                })
                .min()
                .or_else(|| Some((usize::MAX, format!("{} (it has no criteria)", def.id))))
        })
        .collect();
    candidates.sort();
    Err(NoMatch {
        candidates: candidates.into_iter().take(3).map(|(_, s)| s).collect(),
    })
}

/// One definition of the resource's type, as `gitplane explain` shows it: its deciding rule,
/// whether it matched, and why it won or lost.
#[derive(Debug, Clone)]
pub struct Candidate<'d> {
    pub definition: &'d Definition,
    /// The rule that decided: its most specific matching rule, or, when none matches, the
    /// closest one (fewest failing fields). `None` when it has no criteria.
    pub rule: Option<&'d Criterion>,
    /// Index of `rule` in the definition's criteria.
    pub rule_index: Option<usize>,
    pub matched: bool,
    /// The fields `rule` sets, in precedence order (`res_id`, `env_id`, `app_id`, `env_type`):
    /// what makes it specific.
    pub specificity: Vec<&'static str>,
    pub verdict: Verdict,
}

/// Why a candidate won or lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It serves the resource; `runners_up` is how many other definitions matched too.
    Chosen { runners_up: usize },
    /// It matched, but the winner's rule sets `field` and this rule does not (the first field in
    /// precedence order where they differ).
    LessSpecific { field: &'static str, winner: String },
    /// It matched as specifically as the winner; the lower definition id won the tie.
    Tie { winner: String },
    /// Its closest rule fails these fields.
    NoMatch { failed: Vec<Mismatch> },
    /// It has no rules, so it matches nothing.
    NoCriteria,
}

/// A field of a rule that the resource fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub field: &'static str,
    /// The resource's value (`none` when it has none, such as an app-less resource's app_id).
    pub have: String,
    /// The rule's value.
    pub want: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} is {}, the rule wants {}",
            self.field, self.have, self.want
        )
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Chosen { runners_up: 0 } => {
                f.write_str("the only definition of its type with a matching rule")
            }
            Verdict::Chosen { runners_up } => write!(
                f,
                "the most specific matching rule (beats {runners_up} other matching \
                 definition{})",
                if *runners_up == 1 { "" } else { "s" }
            ),
            Verdict::LessSpecific { field, winner } => write!(
                f,
                "matches, but less specific: {winner}'s rule sets {field} and this one does not"
            ),
            Verdict::Tie { winner } => write!(
                f,
                "matches as specifically as {winner}, which wins the tie by definition id"
            ),
            Verdict::NoMatch { failed } => f.write_str(
                &failed
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            Verdict::NoCriteria => f.write_str("it has no criteria, so it matches nothing"),
        }
    }
}

const SPECIFIC_FIELDS: [&str; 4] = ["res_id", "env_id", "app_id", "env_type"];

fn specific_fields(s: Specificity) -> Vec<&'static str> {
    let set = [s.0, s.1, s.2, s.3];
    SPECIFIC_FIELDS
        .iter()
        .zip(set)
        .filter(|(_, on)| *on)
        .map(|(f, _)| *f)
        .collect()
}

/// Every definition of `ctx.res_type` in `definitions` with the rule that decided it, the
/// winner first (the one [`match_definition`] picks), then the other matching definitions from
/// most to least specific, then those that do not match, closest first.
pub fn explain_match<'d>(
    definitions: &[&'d Definition],
    ctx: &MatchContext<'_>,
) -> Vec<Candidate<'d>> {
    struct Best<'d> {
        def: &'d Definition,
        rule: Option<(usize, &'d Criterion)>,
        specificity: Option<Specificity>,
        failed: Vec<Mismatch>,
    }
    let mut all: Vec<Best<'d>> = definitions
        .iter()
        .map(|&def| {
            let mut best_match: Option<(Specificity, usize)> = None;
            let mut closest: Option<(usize, usize)> = None;
            for (i, rule) in def.criteria.iter().enumerate() {
                let miss = mismatches(rule, ctx);
                if miss.is_empty() {
                    let s = specificity(rule);
                    if best_match.is_none_or(|(bs, _)| s > bs) {
                        best_match = Some((s, i));
                    }
                } else if closest.is_none_or(|(n, _)| miss.len() < n) {
                    closest = Some((miss.len(), i));
                }
            }
            match (best_match, closest) {
                (Some((s, i)), _) => Best {
                    def,
                    rule: Some((i, &def.criteria[i])),
                    specificity: Some(s),
                    failed: Vec::new(),
                },
                (None, Some((_, i))) => Best {
                    def,
                    rule: Some((i, &def.criteria[i])),
                    specificity: None,
                    failed: mismatches(&def.criteria[i], ctx)
                        .into_iter()
                        .map(|(field, have, want)| Mismatch {
                            field,
                            have,
                            want: want.to_owned(),
                        })
                        .collect(),
                },
                (None, None) => Best {
                    def,
                    rule: None,
                    specificity: None,
                    failed: Vec::new(),
                },
            }
        })
        .collect();
    // Matching first, most specific first (ties by id, as `match_definition` breaks them); then
    // the closest misses; definitions without rules last.
    all.sort_by(|a, b| {
        let key = |x: &Best<'_>| {
            (
                x.specificity.is_none(),
                std::cmp::Reverse(x.specificity),
                x.rule.is_none(),
                x.failed.len(),
            )
        };
        key(a).cmp(&key(b)).then_with(|| a.def.id.cmp(&b.def.id))
    });
    let winner = all
        .first()
        .and_then(|w| w.specificity.map(|s| (s, w.def.id.clone())));
    let runners_up = all
        .iter()
        .filter(|c| c.specificity.is_some())
        .count()
        .saturating_sub(1);
    all.into_iter()
        .enumerate()
        .map(|(i, c)| {
            let verdict = match (c.specificity, &winner) {
                (Some(_), Some(_)) if i == 0 => Verdict::Chosen { runners_up },
                (Some(s), Some((ws, wid))) => {
                    let mine = [s.0, s.1, s.2, s.3];
                    let theirs = [ws.0, ws.1, ws.2, ws.3];
                    match (0..4).find(|&k| mine[k] != theirs[k]) {
                        Some(k) => Verdict::LessSpecific {
                            field: SPECIFIC_FIELDS[k],
                            winner: wid.clone(),
                        },
                        None => Verdict::Tie {
                            winner: wid.clone(),
                        },
                    }
                }
                _ if c.rule.is_none() => Verdict::NoCriteria,
                _ => Verdict::NoMatch { failed: c.failed },
            };
            let shown = c
                .specificity
                .or_else(|| c.rule.map(|(_, r)| specificity(r)));
            Candidate {
                definition: c.def,
                rule: c.rule.map(|(_, r)| r),
                rule_index: c.rule.map(|(i, _)| i),
                matched: c.specificity.is_some(),
                specificity: shown.map(specific_fields).unwrap_or_default(),
                verdict,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DEFAULT_CLASS, SourceLocation};
    use std::sync::Arc;

    fn rule(fields: &[(&str, &str)]) -> Criterion {
        let get = |k: &str| {
            fields
                .iter()
                .find(|(f, _)| *f == k)
                .map(|(_, v)| v.to_string())
        };
        Criterion {
            res_id: get("res_id"),
            env_id: get("env_id"),
            app_id: get("app_id"),
            env_type: get("env_type"),
            class: get("class").unwrap_or_else(|| DEFAULT_CLASS.into()),
        }
    }

    fn def(id: &str, criteria: Vec<Criterion>) -> Definition {
        Definition {
            id: id.into(),
            name: id.into(),
            res_type: "postgres".into(),
            driver_type: "echo".into(),
            driver_account: None,
            deletion_policy: Default::default(),
            auto_update: true,
            depends_on: vec![],
            labels: Default::default(),
            weight: 0,
            default: false,
            provides: Default::default(),
            values: Default::default(),
            secrets: Default::default(),
            provision: vec![],
            criteria,
            location: SourceLocation::file("definitions/x.yaml"),
            source: Arc::from(""),
            line_offset: 0,
        }
    }

    fn ctx<'a>(class: &'a str) -> MatchContext<'a> {
        MatchContext {
            app_id: Some("shop"),
            env_id: "development",
            env_type: "development",
            res_type: "postgres",
            class,
            res_id: "modules.backend.externals.db",
        }
    }

    fn pick(defs: &[Definition], class: &str) -> Result<String, NoMatch> {
        let refs: Vec<&Definition> = defs.iter().collect();
        match_definition(&refs, &ctx(class)).map(|d| d.id.clone())
    }

    #[test]
    fn precedence_res_id_then_env_id_then_app_id_then_env_type() {
        let defs = vec![
            def("by-type", vec![rule(&[("env_type", "development")])]),
            def("by-app", vec![rule(&[("app_id", "shop")])]),
            def("by-env", vec![rule(&[("env_id", "development")])]),
            def(
                "by-res",
                vec![rule(&[("res_id", "modules.backend.externals.db")])],
            ),
        ];
        assert_eq!(pick(&defs, "default").unwrap(), "by-res");
        assert_eq!(pick(&defs[..3], "default").unwrap(), "by-env");
        assert_eq!(pick(&defs[..2], "default").unwrap(), "by-app");
        assert_eq!(pick(&defs[..1], "default").unwrap(), "by-type");
    }

    #[test]
    fn a_tie_falls_to_the_next_field() {
        let defs = vec![
            def("env-only", vec![rule(&[("env_id", "development")])]),
            def(
                "env-and-type",
                vec![rule(&[
                    ("env_id", "development"),
                    ("env_type", "development"),
                ])],
            ),
            def(
                "env-and-app",
                vec![rule(&[("env_id", "development"), ("app_id", "shop")])],
            ),
        ];
        assert_eq!(pick(&defs, "default").unwrap(), "env-and-app");
        assert_eq!(pick(&defs[..2], "default").unwrap(), "env-and-type");
    }

    #[test]
    fn empty_rule_matches_class_default_only() {
        let defs = vec![def("any", vec![rule(&[])])];
        assert_eq!(pick(&defs, "default").unwrap(), "any");
        assert!(pick(&defs, "large").is_err());
        let defs = vec![def("large", vec![rule(&[("class", "large")])])];
        assert_eq!(pick(&defs, "large").unwrap(), "large");
        assert!(pick(&defs, "default").is_err());
    }

    #[test]
    fn no_match_names_the_closest_candidates() {
        let defs = vec![
            def("prod", vec![rule(&[("env_type", "production")])]),
            def(
                "other-app",
                vec![rule(&[("app_id", "other"), ("env_id", "staging")])],
            ),
            def("none", vec![]),
        ];
        let err = pick(&defs, "default").unwrap_err();
        assert_eq!(
            err.candidates,
            vec![
                "prod (env_type is development, the rule wants production)".to_owned(),
                "other-app (env_id is development, the rule wants staging; app_id is shop, the rule wants other)".to_owned(),
                "none (it has no criteria)".to_owned(),
            ]
        );
    }

    fn explained(defs: &[Definition], class: &str) -> Vec<(String, bool, Verdict)> {
        let refs: Vec<&Definition> = defs.iter().collect();
        explain_match(&refs, &ctx(class))
            .into_iter()
            .map(|c| (c.definition.id.clone(), c.matched, c.verdict))
            .collect()
    }

    #[test]
    fn explain_match_puts_the_winner_first_and_says_why_the_others_lost() {
        let defs = vec![
            def("by-type", vec![rule(&[("env_type", "development")])]),
            def("prod", vec![rule(&[("env_type", "production")])]),
            def("by-env", vec![rule(&[("env_id", "development")])]),
            def(
                "by-res",
                vec![rule(&[("res_id", "modules.backend.externals.db")])],
            ),
            def("none", vec![]),
        ];
        let got = explained(&defs, "default");
        assert_eq!(
            got,
            vec![
                ("by-res".into(), true, Verdict::Chosen { runners_up: 2 }),
                (
                    "by-env".into(),
                    true,
                    Verdict::LessSpecific {
                        field: "res_id",
                        winner: "by-res".into()
                    }
                ),
                (
                    "by-type".into(),
                    true,
                    Verdict::LessSpecific {
                        field: "res_id",
                        winner: "by-res".into()
                    }
                ),
                (
                    "prod".into(),
                    false,
                    Verdict::NoMatch {
                        failed: vec![Mismatch {
                            field: "env_type",
                            have: "development".into(),
                            want: "production".into()
                        }]
                    }
                ),
                ("none".into(), false, Verdict::NoCriteria),
            ]
        );
        let refs: Vec<&Definition> = defs.iter().collect();
        assert_eq!(
            match_definition(&refs, &ctx("default")).unwrap().id,
            got[0].0
        );
    }

    #[test]
    fn explain_match_names_the_field_that_decided_a_tie_of_earlier_fields() {
        let defs = vec![
            def("env-only", vec![rule(&[("env_id", "development")])]),
            def(
                "env-and-app",
                vec![rule(&[("env_id", "development"), ("app_id", "shop")])],
            ),
        ];
        let got = explained(&defs, "default");
        assert_eq!(got[0].2, Verdict::Chosen { runners_up: 1 });
        assert_eq!(
            got[1],
            (
                "env-only".into(),
                true,
                Verdict::LessSpecific {
                    field: "app_id",
                    winner: "env-and-app".into()
                }
            )
        );
        assert_eq!(
            got[1].2.to_string(),
            "matches, but less specific: env-and-app's rule sets app_id and this one does not"
        );
    }

    #[test]
    fn explain_match_shows_the_best_rule_of_each_definition() {
        let defs = [def(
            "multi",
            vec![
                rule(&[("env_type", "production")]),
                rule(&[("env_type", "development")]),
                rule(&[("env_id", "development"), ("env_type", "development")]),
            ],
        )];
        let refs: Vec<&Definition> = defs.iter().collect();
        let got = explain_match(&refs, &ctx("default"));
        assert_eq!(got.len(), 1);
        assert!(got[0].matched);
        assert_eq!(got[0].rule_index, Some(2));
        assert_eq!(got[0].specificity, vec!["env_id", "env_type"]);
        assert_eq!(
            got[0].verdict.to_string(),
            "the only definition of its type with a matching rule"
        );
        // Nothing matches class large: the closest rule of each, with the fields that fail.
        let got = explain_match(&refs, &ctx("large"));
        assert!(!got[0].matched);
        assert_eq!(got[0].rule_index, Some(1));
        assert_eq!(
            got[0].verdict.to_string(),
            "class is large, the rule wants default"
        );
    }

    #[test]
    fn explain_match_orders_misses_closest_first() {
        let defs = vec![
            def(
                "far",
                vec![rule(&[("app_id", "other"), ("env_id", "staging")])],
            ),
            def("near", vec![rule(&[("env_type", "production")])]),
        ];
        let got = explained(&defs, "default");
        let ids: Vec<&str> = got.iter().map(|(id, _, _)| id.as_str()).collect();
        assert_eq!(ids, ["near", "far"]);
        assert!(got.iter().all(|(_, matched, _)| !matched));
    }
}
