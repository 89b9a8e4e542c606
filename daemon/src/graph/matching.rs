//! Matching a resource to one Resource Definition by criteria (DESIGN.md section 5).

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
}
