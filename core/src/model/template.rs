//! Value trees with placeholders in them, and how they resolve to plain JSON values.

use serde_json::Value;

use super::placeholder::{Dialect, ParsedString, Part, PlaceholderError, Segment, parse_string};

/// A JSON-like value whose strings may hold placeholders of type `E`.
///
/// Subtrees without placeholders stay plain [`Value`]s, so most of a definition costs nothing to
/// resolve.
#[derive(Debug, Clone, PartialEq)]
pub enum Template<E> {
    Value(Value),
    /// A string made of text and placeholders; the result is a string.
    Str(Vec<Part<E>>),
    /// A string that is one placeholder: the result keeps the referenced value's type. Boxed,
    /// so a template node is as small as a JSON value: graphs hold hundreds of thousands.
    Whole(Box<E>),
    Array(Vec<Template<E>>),
    Object(Vec<(String, Template<E>)>),
}

/// A placeholder that failed to parse, with the JSON path of the string that held it.
#[derive(Debug, Clone)]
pub struct TemplateError {
    /// Where in the value, such as `values.host`.
    pub path: String,
    /// The string that held the placeholder, to find its line in the file.
    pub text: String,
    pub error: PlaceholderError,
}

impl<E> Default for Template<E> {
    fn default() -> Self {
        Template::Value(Value::Null)
    }
}

impl Template<super::placeholder::Expr> {
    /// Parses every string in `value`; collects every bad placeholder.
    pub fn parse(
        value: &Value,
        dialect: Dialect,
        path: &str,
        errors: &mut Vec<TemplateError>,
    ) -> Self {
        match value {
            Value::String(s) => match parse_string(s, dialect) {
                Ok(ParsedString::Literal(l)) if l == *s => Template::Value(value.clone()),
                Ok(ParsedString::Literal(l)) => Template::Value(Value::String(l)),
                Ok(ParsedString::Whole(e)) => Template::Whole(Box::new(e)),
                Ok(ParsedString::Mixed(parts)) => Template::Str(parts),
                Err(error) => {
                    errors.push(TemplateError {
                        path: path.to_owned(),
                        text: s.clone(),
                        error,
                    });
                    Template::Value(Value::Null)
                }
            },
            Value::Array(items) => {
                let items: Vec<_> = items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| Self::parse(v, dialect, &format!("{path}[{i}]"), errors))
                    .collect();
                if items.iter().all(|t| matches!(t, Template::Value(_))) {
                    Template::Value(Value::Array(
                        items
                            .into_iter()
                            .map(Template::into_value_unchecked)
                            .collect(),
                    ))
                } else {
                    Template::Array(items)
                }
            }
            Value::Object(map) => {
                let fields: Vec<_> = map
                    .iter()
                    .map(|(k, v)| {
                        let child = if path.is_empty() {
                            k.clone()
                        } else {
                            format!("{path}.{k}")
                        };
                        (k.clone(), Self::parse(v, dialect, &child, errors))
                    })
                    .collect();
                // An object is kept as fields even when it holds no placeholder: a JSON map
                // costs some 600 bytes however few its entries, and graphs hold one per small
                // object of every Score file and definition (tens of megabytes at 50 000
                // resources). Resolving builds the map either way.
                if fields.is_empty() {
                    Template::Value(Value::Object(
                        fields
                            .into_iter()
                            .map(|(k, t)| (k, t.into_value_unchecked()))
                            .collect(),
                    ))
                } else {
                    Template::Object(fields)
                }
            }
            other => Template::Value(other.clone()),
        }
    }
}

/// One step into a value tree: an object's key or an array's position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Key(String),
    Index(usize),
}

impl<E> Template<E> {
    /// Puts `leaf` at `path`, turning plain values on the way into templates. A missing key is
    /// added; a missing position, or a step of the wrong kind, leaves the tree as it was.
    pub fn graft_at(&mut self, path: &[Step], leaf: Template<E>) {
        let Some((step, rest)) = path.split_first() else {
            *self = leaf;
            return;
        };
        match step {
            Step::Key(key) => match self {
                Template::Object(_) | Template::Value(Value::Object(_)) => {
                    let mut child = self.take_key(key);
                    child.graft_at(rest, leaf);
                    self.graft(std::slice::from_ref(key), child);
                }
                _ => {}
            },
            Step::Index(i) => {
                if let Template::Value(Value::Array(items)) = self {
                    let items = std::mem::take(items);
                    *self = Template::Array(items.into_iter().map(Template::Value).collect());
                }
                if let Template::Array(items) = self
                    && let Some(item) = items.get_mut(*i)
                {
                    item.graft_at(rest, leaf);
                }
            }
        }
    }

    /// The child at `key` of an object, taken out (a default where missing).
    fn take_key(&mut self, key: &str) -> Template<E> {
        match self {
            Template::Object(fields) => fields
                .iter_mut()
                .find(|(k, _)| k == key)
                .map(|(_, v)| std::mem::take(v))
                .unwrap_or_default(),
            Template::Value(Value::Object(map)) => map
                .get(key)
                .cloned()
                .map(Template::Value)
                .unwrap_or_default(),
            _ => Template::default(),
        }
    }

    /// Puts `leaf` at the object keys `path`, turning plain objects on the way into templates.
    /// A missing key is added; a non-object on the way is replaced.
    pub fn graft(&mut self, path: &[String], leaf: Template<E>) {
        let Some((key, rest)) = path.split_first() else {
            *self = leaf;
            return;
        };
        let mut fields = match std::mem::take(self) {
            Template::Object(fields) => fields,
            Template::Value(Value::Object(map)) => map
                .into_iter()
                .map(|(k, v)| (k, Template::Value(v)))
                .collect(),
            _ => Vec::new(),
        };
        match fields.iter_mut().find(|(k, _)| k == key) {
            Some((_, child)) => child.graft(rest, leaf),
            None => {
                let mut child = Template::default();
                child.graft(rest, leaf);
                fields.push((key.clone(), child));
            }
        }
        *self = Template::Object(fields);
    }

    fn into_value_unchecked(self) -> Value {
        match self {
            Template::Value(v) => v,
            _ => Value::Null,
        }
    }

    /// The value, when the tree holds no placeholder.
    pub fn literal(&self) -> Option<Value> {
        self.resolve(&mut |_: &E| Err(())).ok().map(|r| r.value)
    }

    /// Every placeholder in the tree with the path of the value that holds it (`prefix.a[0]`),
    /// in document order.
    pub fn placeholders(&self, prefix: &str) -> Vec<Placed<'_, E>> {
        let mut out = Vec::new();
        self.collect_placeholders(prefix.to_owned(), &mut out);
        out
    }

    fn collect_placeholders<'a>(&'a self, path: String, out: &mut Vec<Placed<'a, E>>) {
        match self {
            Template::Value(_) => {}
            Template::Str(parts) => out.extend(parts.iter().filter_map(|p| match p {
                Part::Expr(e) => Some(Placed {
                    path: path.clone(),
                    expr: &**e,
                    whole: false,
                }),
                Part::Text(_) => None,
            })),
            Template::Whole(e) => out.push(Placed {
                path,
                expr: &**e,
                whole: true,
            }),
            Template::Array(items) => {
                for (i, t) in items.iter().enumerate() {
                    t.collect_placeholders(format!("{path}[{i}]"), out);
                }
            }
            Template::Object(fields) => {
                for (k, t) in fields {
                    let child = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    t.collect_placeholders(child, out);
                }
            }
        }
    }

    /// Visits every placeholder mutably, in document order.
    pub fn for_each_expr_mut(&mut self, f: &mut impl FnMut(&mut E)) {
        match self {
            Template::Value(_) => {}
            Template::Str(parts) => {
                for p in parts {
                    if let Part::Expr(e) = p {
                        f(e);
                    }
                }
            }
            Template::Whole(e) => f(e),
            Template::Array(items) => items.iter_mut().for_each(|t| t.for_each_expr_mut(f)),
            Template::Object(fields) => fields.iter_mut().for_each(|(_, t)| t.for_each_expr_mut(f)),
        }
    }

    /// Replaces every placeholder; `f` may turn one into literal text (`Err(Value)`) or into
    /// another placeholder type (`Ok(F)`).
    pub fn try_map<F, X>(
        &self,
        f: &mut impl FnMut(&E) -> Result<Mapped<F>, X>,
    ) -> Result<Template<F>, X> {
        Ok(match self {
            Template::Value(v) => Template::Value(v.clone()),
            Template::Whole(e) => match f(e)? {
                Mapped::Expr(n) => Template::Whole(Box::new(n)),
                Mapped::Value(v) => Template::Value(v),
            },
            Template::Str(parts) => {
                let mut out: Vec<Part<F>> = Vec::with_capacity(parts.len());
                for p in parts {
                    let piece = match p {
                        Part::Text(t) => Part::Text(t.clone()),
                        Part::Expr(e) => match f(e)? {
                            Mapped::Expr(n) => Part::Expr(Box::new(n)),
                            Mapped::Value(v) => Part::Text(insert_as_text(&v)),
                        },
                    };
                    // Adjacent text merges, so a string with only context placeholders becomes
                    // a plain value.
                    match (out.last_mut(), piece) {
                        (Some(Part::Text(prev)), Part::Text(t)) => prev.push_str(&t),
                        (_, piece) => out.push(piece),
                    }
                }
                match out.as_slice() {
                    [] => Template::Value(Value::String(String::new())),
                    [Part::Text(t)] => Template::Value(Value::String(t.clone())),
                    _ => Template::Str(out),
                }
            }
            Template::Array(items) => Template::Array(
                items
                    .iter()
                    .map(|t| t.try_map(f))
                    .collect::<Result<_, _>>()?,
            ),
            Template::Object(fields) => Template::Object(
                fields
                    .iter()
                    .map(|(k, t)| Ok((k.clone(), t.try_map(f)?)))
                    .collect::<Result<_, _>>()?,
            ),
        })
    }

    /// Resolves every placeholder with `lookup`, which returns the value and whether it is secret.
    pub fn resolve<'a, X>(
        &'a self,
        lookup: &mut impl FnMut(&'a E) -> Result<Resolved, X>,
    ) -> Result<Resolved, X> {
        Ok(match self {
            Template::Value(v) => Resolved {
                value: v.clone(),
                secret: false,
            },
            Template::Whole(e) => lookup(e)?,
            Template::Str(parts) => {
                let mut s = String::new();
                let mut secret = false;
                for p in parts {
                    match p {
                        Part::Text(t) => s.push_str(t),
                        Part::Expr(e) => {
                            let r = lookup(e)?;
                            secret |= r.secret;
                            s.push_str(&insert_as_text(&r.value));
                        }
                    }
                }
                Resolved {
                    value: Value::String(s),
                    secret,
                }
            }
            Template::Array(items) => {
                let mut secret = false;
                let mut out = Vec::with_capacity(items.len());
                for t in items {
                    let r = t.resolve(lookup)?;
                    secret |= r.secret;
                    out.push(r.value);
                }
                Resolved {
                    value: Value::Array(out),
                    secret,
                }
            }
            Template::Object(fields) => {
                let mut secret = false;
                let mut out = serde_json::Map::new();
                for (k, t) in fields {
                    let r = t.resolve(lookup)?;
                    secret |= r.secret;
                    out.insert(k.clone(), r.value);
                }
                Resolved {
                    value: Value::Object(out),
                    secret,
                }
            }
        })
    }
}

/// A placeholder and where it stands.
#[derive(Debug, Clone)]
pub struct Placed<'a, E> {
    /// The path of the value that holds it, such as `values.host`.
    pub path: String,
    pub expr: &'a E,
    /// Whether it is the whole value (keeping its type) or part of a longer string.
    pub whole: bool,
}

/// What [`Template::try_map`] turns one placeholder into.
pub enum Mapped<F> {
    Expr(F),
    Value(Value),
}

/// A resolved value and whether any secret flowed into it.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub value: Value,
    pub secret: bool,
}

/// Inside a longer string a string is inserted as is and any other value as JSON.
pub fn insert_as_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Follows `path` into `value`.
pub fn lookup_path<'a>(value: &'a Value, path: &[Segment]) -> Option<&'a Value> {
    path.iter().try_fold(value, |v, seg| match seg {
        Segment::Key(k) => v.get(k),
        Segment::Index(i) => v.get(*i),
    })
}

/// A JSON value's kind, for messages that must not quote it (it may be secret).
pub fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::placeholder::Expr;
    use serde_json::json;

    fn parse(v: Value) -> Template<Expr> {
        let mut errors = Vec::new();
        let t = Template::parse(&v, Dialect::Definition, "", &mut errors);
        assert!(errors.is_empty(), "{errors:?}");
        t
    }

    fn resolve_with(t: &Template<Expr>, value: Value, secret: bool) -> Resolved {
        t.resolve(&mut |_e: &Expr| {
            Ok::<_, ()>(Resolved {
                value: value.clone(),
                secret,
            })
        })
        .unwrap()
    }

    #[test]
    fn plain_subtrees_resolve_to_themselves() {
        let v = json!({"a": {"b": [1, "x"]}, "c": true, "d": {}});
        let t = parse(v.clone());
        assert!(t.placeholders("").is_empty());
        assert_eq!(t.literal(), Some(v));
        // A plain array stays one value.
        assert_eq!(parse(json!([1, "x"])), Template::Value(json!([1, "x"])));
    }

    #[test]
    fn whole_placeholder_keeps_type_and_mixed_inserts_json() {
        let t = parse(json!({
            "port": "${resources.pg.outputs.port}",
            "url": "pg:${resources.pg.outputs.port}/${resources.pg.outputs.port}",
        }));
        let r = resolve_with(&t, json!(5432), false);
        assert_eq!(r.value, json!({"port": 5432, "url": "pg:5432/5432"}));
        let r = resolve_with(&t, json!({"k": [1]}), false);
        assert_eq!(r.value["url"], json!(r#"pg:{"k":[1]}/{"k":[1]}"#));
    }

    #[test]
    fn a_string_containing_a_secret_is_secret() {
        let t = parse(json!({"dsn": "user:${resources.pg.outputs.password}@h"}));
        let r = resolve_with(&t, json!("hunter2"), true);
        assert!(r.secret);
    }

    #[test]
    fn bad_placeholders_are_collected_with_their_path() {
        let mut errors = Vec::new();
        Template::parse(
            &json!({"a": ["${resources.x}"], "b": {"c": "${bad.y}"}}),
            Dialect::Definition,
            "values",
            &mut errors,
        );
        let paths: Vec<_> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["values.a[0]", "values.b.c"]);
    }
}
