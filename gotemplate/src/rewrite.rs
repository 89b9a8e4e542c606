//! Prepares a parsed template for rendering: checks every function it names, meters its work,
//! and makes `set`, `unset` and `merge` change the variable they are given, as they do in Go.
//!
//! gotmpl executes a syntax tree that is public, but offers no hook into execution. So the
//! tree is changed before it runs:
//!
//! - Every body that can run many times (a template's body, which `{{template}}` may call
//!   recursively, and a `{{range}}` body) starts with a call of [`STEP_FUNCTION`] that charges
//!   the body's size to the render's budget. Without it, a template calling itself twice per
//!   level would run for years within gotmpl's depth limit, calling no function on the way.
//! - Every action that prints ends in a call of [`SHOW_FUNCTION`], which prints floats, and
//!   lists and dicts holding them, as Go's `fmt` does (`1e+06`, where gotmpl writes `1000000`).
//! - gotmpl's values are immutable, while Sprig's `set`, `unset`, `merge` and
//!   `mergeOverwrite` change the dict they are given (templates write
//!   `{{ $_ := set $d "k" "v" }}` and then use `$d`). A call whose dict is a variable, or a
//!   field path under one, becomes an assignment of the result back to that variable. A dict
//!   reached only through dot (`set .x "k" "v"`) is not changed: `.` cannot be assigned.

use std::collections::{BTreeMap, BTreeSet};

use gotmpl::Template;
use gotmpl::parse::{
    ActionNode, CommandNode, Expr, ListNode, Node, Number, PipeNode, Pos, SmolStr,
};

/// The function whose call starts every metered body; its argument is the body's size.
pub(super) const STEP_FUNCTION: &str = "_gitplaneStep";
/// `_gitplaneThen a b` returns `b`: evaluates an assignment, then reads what it changed.
pub(super) const THEN_FUNCTION: &str = "_gitplaneThen";
/// The last command of every printing action: the value as Go's `fmt` prints it.
pub(super) const SHOW_FUNCTION: &str = "_gitplaneShow";

/// Sprig functions that change the dict given as their first argument.
const MUTATORS: [&str; 6] = [
    "set",
    "unset",
    "merge",
    "mergeOverwrite",
    "mustMerge",
    "mustMergeOverwrite",
];

/// What the template's function names are, as far as gitplane knows them.
pub(super) enum Known {
    Function,
    /// A Sprig (or Helm) function gitplane leaves out, with why.
    Unsupported(&'static str),
    Unknown,
}

/// What the prepared template says about itself, for messages.
#[derive(Debug, Default)]
pub(super) struct Facts {
    /// Every string literal of the template: text its author wrote, which messages may show.
    pub literals: BTreeSet<String>,
    /// For each function the template calls, the lines of its calls.
    pub calls: BTreeMap<String, BTreeSet<usize>>,
}

/// A function the template names that gitplane cannot run, with its line.
#[derive(Debug)]
pub(super) struct BadFunction {
    pub line: usize,
    pub message: String,
}

/// Checks and rewrites every body of `template` (parsed under `name`).
pub(super) fn prepare(
    mut template: Template,
    known: &dyn Fn(&str) -> Known,
) -> Result<(Template, Facts), BadFunction> {
    let mut walker = Walker {
        known,
        facts: Facts::default(),
        errors: Vec::new(),
    };
    let names: Vec<String> = template.templates().into_iter().map(String::from).collect();
    let mut bodies = Vec::with_capacity(names.len());
    for name in names {
        let Some(body) = template.lookup(&name) else {
            continue;
        };
        let mut body = body.clone();
        walker.body(&mut body);
        bodies.push((name, body));
    }
    if let Some(first) = walker.errors.into_iter().min_by_key(|e| e.line) {
        return Err(first);
    }
    for (name, body) in bodies {
        template = template.add_parse_tree(&name, body);
    }
    Ok((template, walker.facts))
}

struct Walker<'a> {
    known: &'a dyn Fn(&str) -> Known,
    facts: Facts,
    errors: Vec<BadFunction>,
}

impl Walker<'_> {
    /// A body that may run many times: walked, then charged for on every entry.
    fn body(&mut self, list: &mut ListNode) {
        let size = self.list(list);
        let pos = list.pos;
        list.nodes.insert(0, step_action(pos, size));
    }

    /// The size of `list`, not counting the bodies inside it that charge for themselves.
    fn list(&mut self, list: &mut ListNode) -> u64 {
        list.nodes.iter_mut().map(|n| self.node(n)).sum()
    }

    fn node(&mut self, node: &mut Node) -> u64 {
        match node {
            Node::Text(_) | Node::Break(_) | Node::Continue(_) => 1,
            Node::Action(action) => {
                let size = 1 + self.pipe(&mut action.pipe);
                if action.pipe.decl.is_empty() {
                    let pos = action.pipe.pos;
                    action.pipe.commands.push(CommandNode {
                        pos,
                        args: vec![Expr::Identifier(pos, SmolStr::new(SHOW_FUNCTION))],
                    });
                }
                size + 1
            }
            Node::If(branch) | Node::With(branch) => {
                let mut size = 1 + self.pipe(&mut branch.pipe) + self.list(&mut branch.body);
                if let Some(other) = branch.else_body.as_mut() {
                    size += self.list(other);
                }
                size
            }
            Node::Range(branch) => {
                let mut size = 1 + self.pipe(&mut branch.pipe);
                self.body(&mut branch.body);
                if let Some(other) = branch.else_body.as_mut() {
                    size += self.list(other);
                }
                size
            }
            Node::Template(call) => 1 + call.pipe.as_mut().map_or(0, |p| self.pipe(p)),
            // Collected at parse time and walked as bodies of their own; never executed here.
            Node::Define(_) => 0,
            Node::List(list) => self.list(list),
        }
    }

    fn pipe(&mut self, pipe: &mut PipeNode) -> u64 {
        let mut size = 1;
        for command in &mut pipe.commands {
            size += 1;
            for arg in &mut command.args {
                size += self.expr(arg);
            }
        }
        rewrite_mutators(pipe);
        size
    }

    fn expr(&mut self, expr: &mut Expr) -> u64 {
        match expr {
            Expr::Identifier(pos, name) => {
                self.function(name, pos.line);
                1
            }
            Expr::Pipe(_, pipe) => 1 + self.pipe(pipe),
            Expr::Chain(_, inner, _) => 1 + self.expr(inner),
            Expr::String(_, text) => {
                self.facts.literals.insert(text.to_string());
                1
            }
            _ => 1,
        }
    }

    fn function(&mut self, name: &str, line: usize) {
        if name == "and" || name == "or" {
            return;
        }
        match (self.known)(name) {
            Known::Function => {
                self.facts
                    .calls
                    .entry(name.to_owned())
                    .or_default()
                    .insert(line);
            }
            Known::Unsupported(why) => self.errors.push(BadFunction {
                line,
                message: format!("`{name}` is not supported by gitplane: {why}"),
            }),
            Known::Unknown => self.errors.push(BadFunction {
                line,
                message: format!(
                    "function \"{name}\" not defined (gitplane knows Go's built-in functions and \
                     Sprig's)"
                ),
            }),
        }
    }
}

/// `{{ _gitplaneStep size }}`: prints nothing, charges `size` steps.
fn step_action(pos: Pos, size: u64) -> Node {
    let size = i64::try_from(size.saturating_add(1)).unwrap_or(i64::MAX);
    Node::Action(ActionNode {
        pos,
        pipe: PipeNode {
            pos,
            decl: Vec::new(),
            commands: vec![CommandNode {
                pos,
                args: vec![
                    Expr::Identifier(pos, SmolStr::new(STEP_FUNCTION)),
                    Expr::Number(pos, Number::Int(size)),
                ],
            }],
            is_assign: false,
        },
    })
}

/// The variable and field path a mutator command changes, when it is one gitplane can assign.
fn mutated_variable(command: &CommandNode) -> Option<(SmolStr, Vec<SmolStr>)> {
    let Some(Expr::Identifier(_, name)) = command.args.first() else {
        return None;
    };
    if !MUTATORS.contains(&name.as_str()) {
        return None;
    }
    match command.args.get(1) {
        // `$` is the template's data, like dot: not assigned.
        Some(Expr::Variable(_, var, fields)) if var.as_str() != "$" => {
            Some((var.clone(), fields.clone()))
        }
        _ => None,
    }
}

/// Turns each `set $d …` of `pipe` (and `merge`, `unset`…) into `($d = set $d …)`, so that the
/// variable holds the changed dict afterwards; `set $d.a.b k v` becomes
/// `_gitplaneThen ($d = set $d "a" (set $d.a "b" (set $d.a.b k v))) $d.a.b`.
///
/// Commands before the mutator in the pipeline become its last argument, as the piped value
/// would, so the assignment can be the pipeline's first command.
fn rewrite_mutators(pipe: &mut PipeNode) {
    let mut i = 0;
    while i < pipe.commands.len() {
        let Some((var, fields)) = mutated_variable(&pipe.commands[i]) else {
            i += 1;
            continue;
        };
        let mut command = pipe.commands[i].clone();
        let pos = command.pos;
        if i > 0 {
            let before = pipe.commands[..i].to_vec();
            command.args.push(Expr::Pipe(pos, plain_pipe(pos, before)));
        }
        // Each level's new value is `set` of the level above with the changed level below.
        for depth in (0..fields.len()).rev() {
            command = CommandNode {
                pos,
                args: vec![
                    Expr::Identifier(pos, SmolStr::new("set")),
                    Expr::Variable(pos, var.clone(), fields[..depth].to_vec()),
                    Expr::String(pos, fields[depth].as_str().into()),
                    Expr::Pipe(pos, plain_pipe(pos, vec![command])),
                ],
            };
        }
        let assignment = Expr::Pipe(
            pos,
            PipeNode {
                pos,
                decl: vec![var.clone()],
                commands: vec![command],
                is_assign: true,
            },
        );
        let replacement = if fields.is_empty() {
            CommandNode {
                pos,
                args: vec![assignment],
            }
        } else {
            CommandNode {
                pos,
                args: vec![
                    Expr::Identifier(pos, SmolStr::new(THEN_FUNCTION)),
                    assignment,
                    Expr::Variable(pos, var, fields),
                ],
            }
        };
        let after = pipe.commands.split_off(i + 1);
        pipe.commands = std::iter::once(replacement).chain(after).collect();
        i = 1;
    }
}

fn plain_pipe(pos: Pos, commands: Vec<CommandNode>) -> PipeNode {
    PipeNode {
        pos,
        decl: Vec::new(),
        commands,
        is_assign: false,
    }
}
