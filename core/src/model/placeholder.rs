//! The placeholder language: parses `${...}` expressions inside strings of definitions and Score files.
//!
//! Grammar (docs/repository.md, section 4), for the Humanitec dialect used in Resource Definitions:
//!
//! ```text
//! string      := (text | escape | placeholder)*
//! escape      := '$\{' | '$${'                 -- both are a literal '${'
//! placeholder := '${' expr '}'
//! expr        := 'resources' descriptor part
//!              | 'context' '.' ('app.id' | 'env.id' | 'env.type' | 'org.id' | 'res.id'
//!                               | 'res.type' | 'res.class' | 'res.guresid')
//! descriptor  := '.' DESC                       -- DESC ends at the first part keyword
//!              | '[' quoted-DESC ']'            -- quotes are ' or ", ids may hold dots
//! DESC        := TYPE ['.' CLASS] ['#' ID] (('>' | '<') TYPE)*   -- selector steps chain
//! part        := '.outputs' path                -- an output, secret or not
//!              | '.values' [path]               -- the non-secret outputs (HPO)
//!              | '.secrets' [path]              -- the secret outputs (HPO)
//!              | '.guresid'                     -- the resource's GUResID (HPO)
//! path        := segment+
//! segment     := '.' NAME | '[' INDEX ']' | '[' quoted-NAME ']'
//! ```
//!
//! A selector (`>` or `<`) reads `.outputs` only.
//!
//! The Score dialect (workload files) has `resources.NAME [path]`, its legacy spelling
//! `externals.NAME [path]` (score-humanitec), `metadata path`, and HPO's `values.KEY` and
//! `shared.ID [path]` instead; `resources.NAME` (and `shared.ID`) with no path is the whole
//! resource.
//! Columns in errors are 1-based character positions of the `${` that opens the bad placeholder.

use std::fmt;

/// Which placeholder forms a string may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// Resource Definitions: `${resources.DESC.outputs...}` and `${context...}`.
    Definition,
    /// Score workload files: `${resources.NAME...}` and `${metadata...}`.
    Score,
}

/// One step into a structured value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Segment {
    Key(String),
    Index(usize),
}

impl fmt::Display for Segment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Segment::Key(k) if is_plain_name(k) => write!(f, ".{k}"),
            Segment::Key(k) => write!(f, "['{k}']"),
            Segment::Index(i) => write!(f, "[{i}]"),
        }
    }
}

/// Writes a path such as `.outputs.a[0]` without the leading dot.
pub fn path_to_string(path: &[Segment]) -> String {
    let s: String = path.iter().map(ToString::to_string).collect();
    s.strip_prefix('.').map(str::to_owned).unwrap_or(s)
}

/// Direction of a resource selector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SelectorDirection {
    /// `DESC>TYPE`: resources of TYPE that DESC depends on.
    DependedOn,
    /// `DESC<TYPE`: resources of TYPE that depend on DESC.
    Dependents,
}

/// `TYPE[.CLASS][#ID]((>|<)TYPE)*`: names a resource relative to the one that holds the
/// placeholder, then, step by step, the resources of each TYPE around the previous step's set.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Descriptor {
    pub res_type: String,
    /// `None`: propagate the referencing resource's class.
    pub class: Option<String>,
    /// `None`: propagate the referencing resource's id.
    pub id: Option<String>,
    /// The selector's steps in order: `workload>aws-policy` is one, `aws-role<workload>aws-policy`
    /// two (the workloads that depend on the role, then the policies those workloads depend
    /// on). Empty: the descriptor names one resource.
    pub selectors: Vec<(SelectorDirection, String)>,
}

impl fmt::Display for Descriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.res_type)?;
        if let Some(class) = &self.class {
            write!(f, ".{class}")?;
        }
        if let Some(id) = &self.id {
            write!(f, "#{id}")?;
        }
        for (direction, selected) in &self.selectors {
            match direction {
                SelectorDirection::DependedOn => write!(f, ">{selected}")?,
                SelectorDirection::Dependents => write!(f, "<{selected}")?,
            }
        }
        Ok(())
    }
}

/// The context values a definition may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContextKey {
    AppId,
    EnvId,
    EnvType,
    /// `context.org.id`: gitplane has no organisations; the repository's `org` setting.
    OrgId,
    ResId,
    ResType,
    ResClass,
    ResGuresId,
}

/// What of a referenced resource a placeholder reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Read {
    /// `.outputs.NAME`: an output, secret or not.
    Outputs,
    /// `.values[.NAME]`: the non-secret outputs (HPO's driver `values`).
    Values,
    /// `.secrets[.NAME]`: the secret outputs (HPO's driver `secrets`).
    Secrets,
    /// `.guresid`: the resource's GUResID, known before anything is provisioned.
    Guresid,
}

impl Read {
    /// The keyword as written: `outputs`, `values`, `secrets`, `guresid`.
    pub fn as_str(self) -> &'static str {
        match self {
            Read::Outputs => "outputs",
            Read::Values => "values",
            Read::Secrets => "secrets",
            Read::Guresid => "guresid",
        }
    }
}

/// What a placeholder refers to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Expr {
    /// `resources.DESC.outputs.PATH` (`path[0]` is the output name), `.values[.PATH]`,
    /// `.secrets[.PATH]` or `.guresid` (no path).
    Resource {
        desc: Descriptor,
        read: Read,
        path: Vec<Segment>,
    },
    Context(ContextKey),
    /// Score: `resources.NAME[.PATH]` or the legacy `externals.NAME[.PATH]`: an output of the
    /// workload's resource NAME, or with no path the whole resource (its non-secret outputs).
    ScoreResource {
        name: String,
        path: Vec<Segment>,
    },
    /// Score: `metadata.PATH`, a value of the workload's own metadata.
    ScoreMetadata {
        path: Vec<Segment>,
    },
    /// Score (as HPO reads it): `values.KEY`, a value of the app's `values.yaml`, the
    /// environment's override first.
    ScoreValue {
        key: String,
    },
    /// Score (as HPO reads it): `shared.ID[.PATH]`, an output of the resource shared under ID,
    /// or with no path the whole resource: the app's resource with `id: ID`, else the
    /// environment's `shared_resources` entry ID.
    ScoreShared {
        id: String,
        path: Vec<Segment>,
    },
    /// Not a placeholder: a `secret_refs` leaf `{store, ref}`, read from the host's secret
    /// store just before a plan.
    Stored(StoreRef),
}

/// `secret_refs: {store: NAME, ref: REF, version: V}`: a secret held by a store configured on
/// the host, never in git.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StoreRef {
    /// Empty when the definition names no store (`{ref: REF}`): the host's default store, as
    /// HPO reads such a ref from the organisation's primary store.
    pub store: String,
    pub reference: String,
    pub version: Option<String>,
}

impl StoreRef {
    /// Whether the definition leaves the store to the host's default.
    pub fn in_default_store(&self) -> bool {
        self.store.is_empty()
    }
}

impl fmt::Display for StoreRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.in_default_store() {
            write!(f, "the default store, ref '{}'", self.reference)?;
        } else {
            write!(f, "store '{}' ref '{}'", self.store, self.reference)?;
        }
        if let Some(v) = &self.version {
            write!(f, " version {v}")?;
        }
        Ok(())
    }
}

/// A piece of a string that holds placeholders.
#[derive(Debug, Clone, PartialEq)]
pub enum Part<E> {
    Text(String),
    /// Boxed, as in [`crate::model::template::Template::Whole`].
    Expr(Box<E>),
}

/// A string after parsing.
#[derive(Debug, Clone, PartialEq)]
pub enum ParsedString {
    /// No placeholder; escapes already replaced.
    Literal(String),
    /// Exactly one placeholder and nothing else: the value keeps its type.
    Whole(Expr),
    /// Text and placeholders: the result is a string.
    Mixed(Vec<Part<Expr>>),
}

/// Why a placeholder does not parse, and where it starts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("column {column}: {reason}")]
pub struct PlaceholderError {
    /// 1-based character column of the `${` that opens the bad placeholder.
    pub column: usize,
    pub reason: String,
}

/// Parses every placeholder of `input`.
pub fn parse_string(input: &str, dialect: Dialect) -> Result<ParsedString, PlaceholderError> {
    if !input.contains('$') {
        return Ok(ParsedString::Literal(input.to_owned()));
    }
    let chars: Vec<char> = input.chars().collect();
    let mut parts: Vec<Part<Expr>> = Vec::new();
    let mut text = String::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let escaped = c == '$'
            && matches!(chars.get(i + 1), Some('\\') | Some('$'))
            && chars.get(i + 2) == Some(&'{');
        if escaped {
            // `$\{` (Humanitec) and `$${` (Score) are a literal `${`.
            text.push_str("${");
            i += 3;
        } else if c == '$' && chars.get(i + 1) == Some(&'{') {
            let column = i + 1;
            let end = find_close(&chars, i + 2).map_err(|reason| PlaceholderError {
                column,
                reason: reason.into(),
            })?;
            let body: String = chars[i + 2..end].iter().collect();
            let expr = parse_expr(body.trim(), dialect)
                .map_err(|reason| PlaceholderError { column, reason })?;
            if !text.is_empty() {
                parts.push(Part::Text(std::mem::take(&mut text)));
            }
            parts.push(Part::Expr(Box::new(expr)));
            i = end + 1;
        } else {
            text.push(c);
            i += 1;
        }
    }
    if !text.is_empty() {
        parts.push(Part::Text(text));
    }
    Ok(match parts.len() {
        0 => ParsedString::Literal(String::new()),
        1 => match parts.pop() {
            Some(Part::Expr(e)) => ParsedString::Whole(*e),
            Some(Part::Text(t)) => ParsedString::Literal(t),
            None => ParsedString::Literal(String::new()),
        },
        _ => ParsedString::Mixed(parts),
    })
}

/// Index of the `}` closing a placeholder whose body starts at `start`; quotes may hold braces.
fn find_close(chars: &[char], start: usize) -> Result<usize, &'static str> {
    let mut quote: Option<char> = None;
    for (offset, &c) in chars[start..].iter().enumerate() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == '}' => return Ok(start + offset),
            None => {}
        }
    }
    match quote {
        Some(_) => Err("unterminated quoted string in placeholder"),
        None => Err("placeholder is not closed: missing '}' (a literal '${' is written '$${')"),
    }
}

fn parse_expr(body: &str, dialect: Dialect) -> Result<Expr, String> {
    if body.is_empty() {
        return Err("empty placeholder".into());
    }
    let (head, rest) = split_head(body);
    match (dialect, head) {
        (Dialect::Definition, "resources") => parse_resource_ref(rest),
        (Dialect::Definition, "context") => parse_context(rest),
        (Dialect::Score, "resources" | "externals") => {
            let path = parse_path(rest)?;
            match path.split_first() {
                Some((Segment::Key(name), tail)) => Ok(Expr::ScoreResource {
                    name: name.clone(),
                    path: tail.to_vec(),
                }),
                _ => Err(format!(
                    "expected '{head}.NAME' or '{head}.NAME.OUTPUT', NAME a key of the \
                     workload's resources"
                )),
            }
        }
        (Dialect::Score, "metadata") => {
            let path = parse_path(rest)?;
            if path.is_empty() {
                return Err("expected 'metadata.KEY'".into());
            }
            Ok(Expr::ScoreMetadata { path })
        }
        (Dialect::Score, "values") => match parse_path(rest)?.as_slice() {
            [Segment::Key(key)] => Ok(Expr::ScoreValue { key: key.clone() }),
            _ => Err("expected 'values.KEY', KEY a key of the app's values.yaml".into()),
        },
        (Dialect::Score, "shared") => {
            let path = parse_path(rest)?;
            match path.split_first() {
                Some((Segment::Key(id), tail)) => Ok(Expr::ScoreShared {
                    id: id.clone(),
                    path: tail.to_vec(),
                }),
                _ => Err(
                    "expected 'shared.ID' or 'shared.ID.OUTPUT', ID the id of a shared resource"
                        .into(),
                ),
            }
        }
        (Dialect::Definition, other) => Err(format!(
            "unknown placeholder root '{other}': expected 'resources' or 'context'"
        )),
        (Dialect::Score, other) => Err(format!(
            "unknown placeholder root '{other}': expected 'resources', 'externals', 'metadata', \
             'values' or 'shared'"
        )),
    }
}

/// Splits the leading identifier from the rest (`resources.x` -> `("resources", ".x")`).
fn split_head(body: &str) -> (&str, &str) {
    let end = body.find(['.', '[']).unwrap_or(body.len());
    (&body[..end], &body[end..])
}

/// The keywords that end a descriptor, each with what it reads.
const PARTS: [(&str, Read); 4] = [
    (".outputs", Read::Outputs),
    (".values", Read::Values),
    (".secrets", Read::Secrets),
    (".guresid", Read::Guresid),
];

fn parse_resource_ref(rest: &str) -> Result<Expr, String> {
    let (desc_text, after) = if let Some(inner) = rest.strip_prefix('[') {
        let (quoted, after) = take_quoted(inner)?;
        let after = after
            .strip_prefix(']')
            .ok_or("expected ']' after the quoted resource descriptor")?;
        (quoted, after)
    } else if let Some(dotted) = rest.strip_prefix('.') {
        let end = find_part(dotted).ok_or(
            "expected '.outputs' after the resource descriptor, as in \
             'resources.TYPE.outputs.NAME' (or '.values', '.secrets', '.guresid')",
        )?;
        (dotted[..end].to_owned(), &dotted[end..])
    } else {
        return Err("expected '.' or '[' after 'resources'".into());
    };
    let desc = parse_descriptor(&desc_text)?;
    let (read, path_text) = PARTS
        .iter()
        .find_map(|(keyword, read)| {
            after
                .strip_prefix(keyword)
                .filter(|p| p.is_empty() || p.starts_with(['.', '[']))
                .map(|p| (*read, p))
        })
        .ok_or(
            "expected '.outputs' after the resource descriptor (or '.values', '.secrets', \
             '.guresid')",
        )?;
    let path = parse_path(path_text)?;
    match read {
        Read::Outputs if path.is_empty() => {
            return Err("expected an output name after '.outputs'".into());
        }
        Read::Guresid if !path.is_empty() => {
            return Err("'.guresid' is the resource's GUResID: nothing may follow it".into());
        }
        _ => {}
    }
    if !matches!(path.first(), None | Some(Segment::Key(_))) {
        return Err(format!(
            "the first step after '.{}' must be an output name",
            read.as_str()
        ));
    }
    if !desc.selectors.is_empty() && read != Read::Outputs {
        return Err(format!(
            "a selector reads outputs: write '.outputs.NAME', not '.{}'",
            read.as_str()
        ));
    }
    Ok(Expr::Resource { desc, read, path })
}

/// Byte index of the part keyword (`.outputs`, `.values`, `.secrets`, `.guresid`) that ends a
/// dotted descriptor: the first one followed by `.`, `[` or the end.
fn find_part(s: &str) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (keyword, _) in PARTS {
        let mut from = 0;
        while let Some(pos) = s[from..].find(keyword) {
            let at = from + pos;
            let next = s[at + keyword.len()..].chars().next();
            if matches!(next, None | Some('.') | Some('[')) {
                best = Some(best.map_or(at, |b| b.min(at)));
                break;
            }
            from = at + 1;
        }
    }
    best
}

/// `driver_account`: an account name, or one placeholder `${resources.DESC.account}` (also
/// `${resources['DESC'].account}`) naming the resource whose account to use. `Ok(None)`: a
/// plain name.
pub fn parse_account_ref(text: &str) -> Result<Option<Descriptor>, String> {
    const FORM: &str = "driver_account is an account name, or one placeholder \
                        '${resources.TYPE[.CLASS][#ID].account}' naming the resource whose \
                        account to use";
    if !text.contains("${") {
        return Ok(None);
    }
    let body = text
        .strip_prefix("${")
        .and_then(|b| b.strip_suffix('}'))
        .ok_or(FORM)?;
    let desc_text = body
        .strip_prefix("resources")
        .and_then(|rest| rest.strip_suffix(".account"))
        .ok_or(FORM)?;
    let desc_text = if let Some(inner) = desc_text.strip_prefix('[') {
        let (quoted, after) = take_quoted(inner)?;
        if after != "]" {
            return Err(FORM.to_owned());
        }
        quoted
    } else if let Some(dotted) = desc_text.strip_prefix('.') {
        // `.outputs.account` and the like read an output, not the resource's account.
        if find_part(&format!("{dotted}.")).is_some() {
            return Err(FORM.to_owned());
        }
        dotted.to_owned()
    } else {
        return Err(FORM.to_owned());
    };
    let desc = parse_descriptor(&desc_text)?;
    if !desc.selectors.is_empty() {
        return Err(format!(
            "'{desc}' is a selector, which names many resources: driver_account names one"
        ));
    }
    Ok(Some(desc))
}

fn parse_descriptor(text: &str) -> Result<Descriptor, String> {
    let (main, selectors) = match text.find(['>', '<']) {
        Some(pos) => {
            let mut selectors = Vec::new();
            let mut rest = &text[pos..];
            while let Some(arrow) = rest.chars().next() {
                let dir = if arrow == '>' {
                    SelectorDirection::DependedOn
                } else {
                    SelectorDirection::Dependents
                };
                let step = &rest[1..];
                let end = step.find(['>', '<']).unwrap_or(step.len());
                check_name(&step[..end], "selected resource type")?;
                selectors.push((dir, step[..end].to_owned()));
                rest = &step[end..];
            }
            (&text[..pos], selectors)
        }
        None => (text, Vec::new()),
    };
    let (type_class, id) = match main.split_once('#') {
        Some((tc, id)) => {
            if id.is_empty() {
                return Err("empty resource id after '#'".into());
            }
            (tc, Some(id.to_owned()))
        }
        None => (main, None),
    };
    let (res_type, class) = match type_class.split_once('.') {
        Some((t, c)) => {
            check_name(c, "resource class")?;
            (t, Some(c.to_owned()))
        }
        None => (type_class, None),
    };
    check_name(res_type, "resource type")?;
    Ok(Descriptor {
        res_type: res_type.to_owned(),
        class,
        id,
        selectors,
    })
}

fn check_name(name: &str, what: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("empty {what}"));
    }
    if !is_plain_name(name) {
        return Err(format!(
            "invalid {what} '{name}': use letters, digits, '-' and '_'"
        ));
    }
    Ok(())
}

fn is_plain_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn parse_context(rest: &str) -> Result<Expr, String> {
    let key = match rest {
        ".app.id" => ContextKey::AppId,
        ".env.id" => ContextKey::EnvId,
        ".env.type" => ContextKey::EnvType,
        ".org.id" => ContextKey::OrgId,
        ".res.id" => ContextKey::ResId,
        ".res.type" => ContextKey::ResType,
        ".res.class" => ContextKey::ResClass,
        ".res.guresid" => ContextKey::ResGuresId,
        _ => {
            return Err(format!(
                "unknown context 'context{rest}': expected one of context.app.id, context.env.id, \
                 context.env.type, context.org.id, context.res.id, context.res.type, \
                 context.res.class, context.res.guresid"
            ));
        }
    };
    Ok(Expr::Context(key))
}

/// Parses `.a.b[0]['c.d']` into segments.
fn parse_path(mut rest: &str) -> Result<Vec<Segment>, String> {
    let mut out = Vec::new();
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            let name = &after[..end];
            if name.is_empty() {
                return Err("empty name in path".into());
            }
            if !is_plain_name(name) {
                return Err(format!(
                    "invalid name '{name}' in path: quote it as ['{name}']"
                ));
            }
            out.push(Segment::Key(name.to_owned()));
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('[') {
            if after.starts_with(['\'', '"']) {
                let (key, after) = take_quoted(after)?;
                rest = after
                    .strip_prefix(']')
                    .ok_or("expected ']' after a quoted key")?;
                out.push(Segment::Key(key));
            } else {
                let end = after.find(']').ok_or("expected ']' after an index")?;
                let index: usize = after[..end]
                    .trim()
                    .parse()
                    .map_err(|_| format!("invalid index '[{}]'", &after[..end]))?;
                out.push(Segment::Index(index));
                rest = &after[end + 1..];
            }
        } else {
            return Err(format!("unexpected '{rest}' in path"));
        }
    }
    Ok(out)
}

/// Takes `'...'` or `"..."` from the start of `s`; returns the contents and what follows.
fn take_quoted(s: &str) -> Result<(String, &str), String> {
    let quote = s
        .chars()
        .next()
        .filter(|c| *c == '\'' || *c == '"')
        .ok_or("expected a quoted string")?;
    let body = &s[1..];
    let end = body.find(quote).ok_or("unterminated quoted string")?;
    Ok((body[..end].to_owned(), &body[end + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(s: &str) -> Expr {
        match parse_string(s, Dialect::Definition) {
            Ok(ParsedString::Whole(e)) => e,
            other => panic!("expected one placeholder in {s:?}, got {other:?}"),
        }
    }

    fn key(s: &str) -> Segment {
        Segment::Key(s.into())
    }

    #[test]
    fn dotted_reference_with_id() {
        let e = whole("${resources.base-env#base-env.outputs.pghost}");
        assert_eq!(
            e,
            Expr::Resource {
                desc: Descriptor {
                    res_type: "base-env".into(),
                    class: None,
                    id: Some("base-env".into()),
                    selectors: Vec::new()
                },
                read: Read::Outputs,
                path: vec![key("pghost")],
            }
        );
    }

    #[test]
    fn bracket_descriptor_keeps_dots_in_id() {
        let e = whole("${resources['dns.public#shared.dns'].outputs.host}");
        let Expr::Resource { desc, path, .. } = e else {
            panic!("not a resource")
        };
        assert_eq!(desc.res_type, "dns");
        assert_eq!(desc.class.as_deref(), Some("public"));
        assert_eq!(desc.id.as_deref(), Some("shared.dns"));
        assert_eq!(path, vec![key("host")]);
    }

    #[test]
    fn dotted_id_with_dots_ends_at_outputs() {
        let Expr::Resource { desc, path, .. } = whole("${resources.dns#shared.dns.outputs.a.b[2]}")
        else {
            panic!("not a resource")
        };
        assert_eq!(desc.id.as_deref(), Some("shared.dns"));
        assert_eq!(path, vec![key("a"), key("b"), Segment::Index(2)]);
    }

    #[test]
    fn selectors_parse_both_directions() {
        let Expr::Resource { desc, .. } = whole("${resources.workload>aws-policy.outputs.name}")
        else {
            panic!()
        };
        assert_eq!(
            desc.selectors,
            [(SelectorDirection::DependedOn, "aws-policy".into())]
        );
        let Expr::Resource { desc, .. } =
            whole("${resources['dns.public#shared.dns<route'].outputs.path}")
        else {
            panic!()
        };
        assert_eq!(
            desc.selectors,
            [(SelectorDirection::Dependents, "route".into())]
        );
        assert_eq!(desc.id.as_deref(), Some("shared.dns"));
    }

    #[test]
    fn a_driver_account_names_an_account_or_the_resource_whose_account_to_use() {
        assert_eq!(parse_account_ref("aws-prod"), Ok(None));
        let desc = parse_account_ref("${resources['config.default#aws'].account}")
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                desc.res_type.as_str(),
                desc.class.as_deref(),
                desc.id.as_deref()
            ),
            ("config", Some("default"), Some("aws"))
        );
        let desc = parse_account_ref("${resources.config#accounts.account}")
            .unwrap()
            .unwrap();
        assert_eq!(
            (desc.res_type.as_str(), desc.id.as_deref()),
            ("config", Some("accounts"))
        );
        for (text, reason) in [
            (
                "${resources.config.outputs.account}",
                "driver_account is an account name, or one",
            ),
            (
                "prefix-${resources.config.account}",
                "driver_account is an account name, or one",
            ),
            (
                "${context.env.id}",
                "driver_account is an account name, or one",
            ),
            ("${resources['config>x'].account}", "is a selector"),
            (
                "${resources['config.a b'].account}",
                "invalid resource class",
            ),
        ] {
            let err = parse_account_ref(text).unwrap_err();
            assert!(err.contains(reason), "{text}: {err}");
        }
    }

    #[test]
    fn score_files_read_app_values_and_shared_resources_as_hpo_does() {
        let score = |text: &str| match parse_string(text, Dialect::Score) {
            Ok(ParsedString::Whole(e)) => e,
            other => panic!("{text}: {other:?}"),
        };
        assert_eq!(
            score("${values.LOG_LEVEL}"),
            Expr::ScoreValue {
                key: "LOG_LEVEL".into()
            }
        );
        assert_eq!(
            score("${shared.dns.host}"),
            Expr::ScoreShared {
                id: "dns".into(),
                path: vec![key("host")]
            }
        );
        assert_eq!(
            score("${shared['main-db']}"),
            Expr::ScoreShared {
                id: "main-db".into(),
                path: vec![]
            }
        );
        for (text, reason) in [
            ("${values}", "expected 'values.KEY'"),
            ("${values.a.b}", "expected 'values.KEY'"),
            ("${shared}", "expected 'shared.ID'"),
        ] {
            let err = parse_string(text, Dialect::Score).unwrap_err();
            assert!(err.reason.contains(reason), "{text}: {}", err.reason);
        }
        // Definitions read resources and context only.
        let err = parse_string("${values.x}", Dialect::Definition).unwrap_err();
        assert!(err.reason.contains("unknown placeholder root 'values'"));
    }

    #[test]
    fn selectors_chain_step_by_step() {
        let Expr::Resource { desc, path, .. } =
            whole("${resources[\"aws-role<workload>aws-policy\"].outputs.arn}")
        else {
            panic!()
        };
        assert_eq!(desc.res_type, "aws-role");
        assert_eq!(
            desc.selectors,
            [
                (SelectorDirection::Dependents, "workload".into()),
                (SelectorDirection::DependedOn, "aws-policy".into()),
            ]
        );
        assert_eq!(path, vec![key("arn")]);
        assert_eq!(desc.to_string(), "aws-role<workload>aws-policy");
        for (text, reason) in [
            (
                "${resources.a<>b.outputs.x}",
                "empty selected resource type",
            ),
            (
                "${resources.a>b<.outputs.x}",
                "empty selected resource type",
            ),
            (
                "${resources['a>b<c d'].outputs.x}",
                "invalid selected resource type 'c d'",
            ),
        ] {
            let err = parse_string(text, Dialect::Definition).unwrap_err();
            assert!(err.reason.contains(reason), "{text}: {}", err.reason);
        }
    }

    #[test]
    fn mixed_text_and_escapes() {
        let p = parse_string(
            "postgres://${resources.postgres.outputs.host}:$\\{x} $${y}",
            Dialect::Definition,
        )
        .unwrap();
        let ParsedString::Mixed(parts) = p else {
            panic!("{p:?}")
        };
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[0], Part::Text("postgres://".into()));
        assert_eq!(parts[2], Part::Text(":${x} ${y}".into()));
    }

    #[test]
    fn escapes_alone_are_literal() {
        assert_eq!(
            parse_string("$\\{not} and $${not}", Dialect::Score).unwrap(),
            ParsedString::Literal("${not} and ${not}".into())
        );
    }

    #[test]
    fn context_keys() {
        assert_eq!(
            whole("${context.res.guresid}"),
            Expr::Context(ContextKey::ResGuresId)
        );
        let err = parse_string("x ${context.nope}", Dialect::Definition).unwrap_err();
        assert_eq!(err.column, 3);
    }

    #[test]
    fn score_forms() {
        let p = parse_string("${resources.db.host}", Dialect::Score).unwrap();
        assert_eq!(
            p,
            ParsedString::Whole(Expr::ScoreResource {
                name: "db".into(),
                path: vec![key("host")]
            })
        );
        let p = parse_string("${metadata.name}", Dialect::Score).unwrap();
        assert_eq!(
            p,
            ParsedString::Whole(Expr::ScoreMetadata {
                path: vec![key("name")]
            })
        );
    }

    /// HPO's forms without `.outputs`, as Humanitec's example library writes them.
    #[test]
    fn values_secrets_and_guresid_parts() {
        let read = |s: &str| match whole(s) {
            Expr::Resource { desc, read, path } => (desc.to_string(), read, path_to_string(&path)),
            other => panic!("{s}: {other:?}"),
        };
        assert_eq!(
            read("${resources.dns.guresid}"),
            ("dns".into(), Read::Guresid, String::new())
        );
        assert_eq!(
            read("${resources[\"base-env.default#resource-quota\"].guresid}"),
            (
                "base-env.default#resource-quota".into(),
                Read::Guresid,
                String::new()
            )
        );
        assert_eq!(
            read("${resources['dns.default#x'].values.y}"),
            ("dns.default#x".into(), Read::Values, "y".into())
        );
        assert_eq!(
            read("${resources['config.developer-overrides'].values}"),
            (
                "config.developer-overrides".into(),
                Read::Values,
                String::new()
            )
        );
        assert_eq!(
            read("${resources.db#shared.db.secrets.password}"),
            ("db#shared.db".into(), Read::Secrets, "password".into())
        );
        // The first part keyword ends the descriptor; a class may merely start like one.
        assert_eq!(
            read("${resources.config.values-x.outputs.a}"),
            ("config.values-x".into(), Read::Outputs, "a".into())
        );
        assert_eq!(whole("${context.org.id}"), Expr::Context(ContextKey::OrgId));
        for (bad, needle) in [
            ("${resources.dns.guresid.x}", "nothing may follow it"),
            (
                "${resources.workload>dns.guresid}",
                "a selector reads outputs",
            ),
            (
                "${resources.workload<dns.values.x}",
                "a selector reads outputs",
            ),
            ("${resources.dns.values[0]}", "must be an output name"),
        ] {
            let err = parse_string(bad, Dialect::Definition).unwrap_err();
            assert!(err.reason.contains(needle), "{bad}: {err}");
        }
    }

    #[test]
    fn score_whole_resources_and_legacy_externals() {
        for (text, name, path) in [
            ("${resources.data}", "data", vec![]),
            ("${externals.db.host}", "db", vec![key("host")]),
            ("${externals.db}", "db", vec![]),
        ] {
            assert_eq!(
                parse_string(text, Dialect::Score).unwrap(),
                ParsedString::Whole(Expr::ScoreResource {
                    name: name.into(),
                    path
                }),
                "{text}"
            );
        }
        let err = parse_string("${env.x}", Dialect::Score).unwrap_err();
        assert!(
            err.reason
                .contains("'resources', 'externals', 'metadata', 'values' or 'shared'"),
            "{err}"
        );
        let err = parse_string("${externals}", Dialect::Score).unwrap_err();
        assert!(err.reason.contains("expected 'externals.NAME'"), "{err}");
    }

    #[test]
    fn bad_placeholders_report_their_column() {
        for (input, column, needle) in [
            ("${resources.postgres.host}", 1, "'.outputs'"),
            ("abc ${resources.postgres.outputs.x", 5, "not closed"),
            ("ab${resources..outputs.x}", 3, "empty resource type"),
            ("${nope.x}", 1, "unknown placeholder root"),
            ("${resources.pg.outputs}", 1, "output name"),
            ("${resources['pg#x.outputs.y}", 1, "unterminated"),
            ("é ${resources.pg#.outputs.x}", 3, "empty resource id"),
            ("${}", 1, "empty placeholder"),
        ] {
            let err = parse_string(input, Dialect::Definition).unwrap_err();
            assert_eq!(err.column, column, "{input}: {err}");
            assert!(err.reason.contains(needle), "{input}: {err}");
        }
    }
}
