//! The state one render shares with the template functions: its work budget, the template's
//! own string literals and a cache of compiled regular expressions.
//!
//! gotmpl calls the functions with their arguments only, so this state lives in a
//! thread-local, installed by [`install`] for the length of one render: a template is parsed
//! once and may render on several threads at the same time, each with a budget of its own.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::sync::Arc;

use gotmpl::TemplateError;
use regex::Regex;

use super::sprig::fail;

/// How many steps one render may take: a step is one node of the template executed (about
/// 25 ns), and functions charge what they do in the same currency (8 steps a call, a step per
/// 32 bytes copied or 2 characters mapped, 2000 to compile a regular expression…). Real
/// definitions take a few thousand; the worst template stops within about a second.
pub(super) const STEP_BUDGET: u64 = 30_000_000;

/// Compiled patterns kept per render, so a `regexMatch` in a loop compiles once.
const REGEX_CACHE_ENTRIES: usize = 16;
/// Longer patterns are compiled on every call rather than kept.
const REGEX_CACHE_MAX_PATTERN: usize = 4096;

/// What the functions of one render share.
struct RenderContext {
    steps_left: u64,
    /// The template's string literals: text the author wrote, which messages may quote.
    literals: Arc<BTreeSet<String>>,
    regexes: Vec<(String, Regex)>,
}

thread_local! {
    static CONTEXT: RefCell<Option<RenderContext>> = const { RefCell::new(None) };
}

/// Removes the render's context when the render ends, however it ends.
pub(super) struct ContextGuard(());

impl Drop for ContextGuard {
    fn drop(&mut self) {
        CONTEXT.with(|c| c.borrow_mut().take());
    }
}

/// Starts a render on this thread: a full budget and the template's literals.
pub(super) fn install(literals: Arc<BTreeSet<String>>) -> ContextGuard {
    CONTEXT.with(|c| {
        *c.borrow_mut() = Some(RenderContext {
            steps_left: STEP_BUDGET,
            literals,
            regexes: Vec::new(),
        });
    });
    ContextGuard(())
}

/// Takes `steps` from the budget; fails once it is spent. Outside a render (a function called
/// directly) nothing is counted.
pub(super) fn charge(name: &str, steps: u64) -> Result<(), TemplateError> {
    CONTEXT.with(|c| match c.borrow_mut().as_mut() {
        Some(ctx) if ctx.steps_left < steps => {
            ctx.steps_left = 0;
            Err(fail(
                name,
                format!(
                    "the template does too much work (more than {STEP_BUDGET} steps): look for a \
                     loop that runs far more often than intended"
                ),
            ))
        }
        Some(ctx) => {
            ctx.steps_left -= steps;
            Ok(())
        }
        None => Ok(()),
    })
}

/// Steps for copying or comparing `bytes` bytes.
pub(super) fn charge_bytes(name: &str, bytes: usize) -> Result<(), TemplateError> {
    charge(name, 1 + (bytes as u64) / 32)
}

/// Steps for work on each character of `bytes` bytes of text (case mapping, splitting).
pub(super) fn charge_chars(name: &str, bytes: usize) -> Result<(), TemplateError> {
    charge(name, 1 + (bytes as u64) / 2)
}

/// Whether `text` is one of the template's own string literals, so a message may show it.
pub(super) fn is_literal(text: &str) -> bool {
    CONTEXT.with(|c| {
        c.borrow()
            .as_ref()
            .is_some_and(|ctx| ctx.literals.contains(text))
    })
}

/// The compiled form of `pattern`, when this render compiled it before.
pub(super) fn cached_regex(pattern: &str) -> Option<Regex> {
    CONTEXT.with(|c| {
        c.borrow().as_ref().and_then(|ctx| {
            ctx.regexes
                .iter()
                .find(|(p, _)| p == pattern)
                .map(|(_, r)| r.clone())
        })
    })
}

/// Keeps the compiled form of `pattern` for the rest of the render (short patterns only).
pub(super) fn keep_regex(pattern: &str, regex: &Regex) {
    if pattern.len() > REGEX_CACHE_MAX_PATTERN {
        return;
    }
    CONTEXT.with(|c| {
        if let Some(ctx) = c.borrow_mut().as_mut() {
            if ctx.regexes.len() >= REGEX_CACHE_ENTRIES {
                ctx.regexes.remove(0);
            }
            ctx.regexes.push((pattern.to_owned(), regex.clone()));
        }
    });
}
