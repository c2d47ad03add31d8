//! Publication tag filters: the `tf` of a `subscribe` (`FilterNode` of
//! `client.proto`), evaluated on the server against each publication's
//! tags before it is delivered or recovered, with the operators and
//! rules of Centrifugo's documentation ("Publication filtering by tags"):
//!
//! - a leaf (`op` empty) compares the tag `key` with `cmp`: `eq`, `neq`,
//!   `in`, `nin` (against `vals`), `ex`, `nex` (the key is there or not),
//!   `sw`, `ew`, `ct` (starts with, ends with, contains), and `gt`, `gte`,
//!   `lt`, `lte`, which compare as decimal numbers (a tag that is not a
//!   number does not match);
//! - `and` and `or` hold at least one node, `not` exactly one.
//!
//! A filter that breaks these rules (those of centrifuge's
//! `filter.Validate`: a leaf needs a known `cmp`, its value or values as
//! the comparison takes them, and a `key` except for `ex` and `nex`), or
//! nests deeper than [`MAX_DEPTH`] or holds more than [`MAX_NODES`], is
//! refused at subscribe (3501 "bad request", as Centrifugo closes the
//! connection for it). Numbers compare exactly, at any precision.

use std::cmp::Ordering;

use herald_core::Tags;
use serde::Deserialize;

/// Deepest nesting of `nodes` a filter may have; deeper is refused (the
/// filter is evaluated recursively for every publication).
pub(crate) const MAX_DEPTH: usize = 16;
/// Most nodes, leaves included, a filter may have.
pub(crate) const MAX_NODES: usize = 256;

/// One node of a filter, as the client sends it (`FilterNode` of
/// `client.proto`, both forms: JSON and protobuf, field numbers as
/// published there).
#[derive(Clone, Deserialize, PartialEq, Eq, prost::Message)]
#[serde(deny_unknown_fields)]
pub(crate) struct FilterNode {
    /// `""` a leaf, or `and`, `or`, `not`.
    #[serde(default)]
    #[prost(string, tag = "1")]
    pub(crate) op: String,
    /// A leaf's tag key.
    #[serde(default)]
    #[prost(string, tag = "2")]
    pub(crate) key: String,
    /// A leaf's comparison.
    #[serde(default)]
    #[prost(string, tag = "3")]
    pub(crate) cmp: String,
    /// A leaf's value (all comparisons but `in`, `nin`, `ex`, `nex`).
    #[serde(default)]
    #[prost(string, tag = "4")]
    pub(crate) val: String,
    /// A leaf's values (`in`, `nin`).
    #[serde(default)]
    #[prost(string, repeated, tag = "5")]
    pub(crate) vals: Vec<String>,
    /// The children of `and`, `or`, `not`.
    #[serde(default)]
    #[prost(message, repeated, tag = "6")]
    pub(crate) nodes: Vec<FilterNode>,
}

/// Why a filter is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid tags filter: {0}")]
pub(crate) struct InvalidFilter(&'static str);

impl FilterNode {
    /// Checks the filter's shape (see the module's rules), its depth
    /// ([`MAX_DEPTH`]) and size ([`MAX_NODES`]).
    ///
    /// # Errors
    /// [`InvalidFilter`] naming the first rule broken.
    pub(crate) fn validate(&self) -> Result<(), InvalidFilter> {
        let mut nodes = 0;
        self.validate_at(1, &mut nodes)
    }

    fn validate_at(&self, depth: usize, nodes: &mut usize) -> Result<(), InvalidFilter> {
        *nodes += 1;
        if depth > MAX_DEPTH {
            return Err(InvalidFilter("nested too deep"));
        }
        if *nodes > MAX_NODES {
            return Err(InvalidFilter("too many nodes"));
        }
        match self.op.as_str() {
            "" => {
                match self.cmp.as_str() {
                    "eq" | "neq" | "sw" | "ew" | "ct" | "gt" | "gte" | "lt" | "lte" => {
                        if self.val.is_empty() || !self.vals.is_empty() {
                            return Err(InvalidFilter("the comparison takes val only"));
                        }
                    }
                    "in" | "nin" => {
                        if self.vals.is_empty() || !self.val.is_empty() {
                            return Err(InvalidFilter("the comparison takes vals only"));
                        }
                    }
                    "ex" | "nex" => {
                        if !self.val.is_empty() || !self.vals.is_empty() {
                            return Err(InvalidFilter("the comparison takes no value"));
                        }
                    }
                    "" => return Err(InvalidFilter("a leaf needs cmp")),
                    _ => return Err(InvalidFilter("unknown cmp")),
                }
                if self.key.is_empty() && !matches!(self.cmp.as_str(), "ex" | "nex") {
                    return Err(InvalidFilter("a leaf needs key"));
                }
                Ok(())
            }
            "and" | "or" | "not" => {
                match (self.op.as_str(), self.nodes.len()) {
                    (_, 0) => return Err(InvalidFilter("an operator needs nodes")),
                    ("not", n) if n != 1 => return Err(InvalidFilter("not takes one node")),
                    _ => {}
                }
                self.nodes
                    .iter()
                    .try_for_each(|n| n.validate_at(depth + 1, nodes))
            }
            _ => Err(InvalidFilter("unknown op")),
        }
    }

    /// Whether a publication with `tags` passes this (validated) filter.
    pub(crate) fn matches(&self, tags: &Tags) -> bool {
        match self.op.as_str() {
            "and" => self.nodes.iter().all(|n| n.matches(tags)),
            "or" => self.nodes.iter().any(|n| n.matches(tags)),
            "not" => !self.nodes.iter().all(|n| n.matches(tags)),
            _ => self.leaf(tags.get(&self.key)),
        }
    }

    fn leaf(&self, tag: Option<&str>) -> bool {
        let val = self.val.as_str();
        match (self.cmp.as_str(), tag) {
            ("eq", Some(t)) => t == val,
            ("neq", t) => t != Some(val),
            ("in", t) => self.vals.iter().any(|v| Some(v.as_str()) == t.or(Some(""))),
            ("nin", t) => !self.vals.iter().any(|v| Some(v.as_str()) == t.or(Some(""))),
            ("ex", t) => t.is_some(),
            ("nex", t) => t.is_none(),
            ("sw", Some(t)) => t.starts_with(val),
            ("ew", Some(t)) => t.ends_with(val),
            ("ct", Some(t)) => t.contains(val),
            (cmp @ ("gt" | "gte" | "lt" | "lte"), Some(t)) => match compare_decimal(t, val) {
                Some(order) => match cmp {
                    "gt" => order == Ordering::Greater,
                    "gte" => order != Ordering::Less,
                    "lt" => order == Ordering::Less,
                    _ => order != Ordering::Greater,
                },
                None => false,
            },
            _ => false,
        }
    }
}

/// A decimal number's parts: negative, integer digits without leading
/// zeros, fraction digits without trailing zeros.
fn decimal(text: &str) -> Option<(bool, &str, &str)> {
    let (negative, rest) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let (int, frac) = rest.split_once('.').unwrap_or((rest, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty() || !digits(int) || !digits(frac) || rest.ends_with('.') {
        return None;
    }
    let int = int.trim_start_matches('0');
    let frac = frac.trim_end_matches('0');
    let zero = int.is_empty() && frac.is_empty();
    Some((negative && !zero, int, frac))
}

/// Compares two decimal numbers exactly (`-12.50` equals `-12.5`); `None`
/// when either is not one.
pub(crate) fn compare_decimal(a: &str, b: &str) -> Option<Ordering> {
    let (a_neg, a_int, a_frac) = decimal(a)?;
    let (b_neg, b_int, b_frac) = decimal(b)?;
    let magnitude = a_int
        .len()
        .cmp(&b_int.len())
        .then_with(|| a_int.cmp(b_int))
        .then_with(|| a_frac.cmp(b_frac));
    Some(match (a_neg, b_neg) {
        (false, true) => Ordering::Greater,
        (true, false) => Ordering::Less,
        (false, false) => magnitude,
        (true, true) => magnitude.reverse(),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn leaf(key: &str, cmp: &str, val: &str) -> FilterNode {
        FilterNode {
            key: key.to_owned(),
            cmp: cmp.to_owned(),
            val: val.to_owned(),
            ..FilterNode::default()
        }
    }

    fn tags(pairs: &[(&str, &str)]) -> Tags {
        Tags::new(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>(),
        )
    }

    #[test]
    fn leaves_compare_as_documented() {
        let t = tags(&[("team", "eng"), ("n", "10.50"), ("path", "/a/b")]);
        assert!(leaf("team", "eq", "eng").matches(&t));
        assert!(!leaf("team", "eq", "ops").matches(&t));
        assert!(!leaf("missing", "eq", "eng").matches(&t));
        assert!(leaf("team", "neq", "ops").matches(&t));
        assert!(leaf("missing", "neq", "x").matches(&t));
        assert!(leaf("path", "sw", "/a").matches(&t));
        assert!(leaf("path", "ew", "/b").matches(&t));
        assert!(leaf("path", "ct", "a/").matches(&t));
        assert!(!leaf("missing", "ct", "a").matches(&t));
        assert!(leaf("n", "gt", "9.99").matches(&t));
        assert!(leaf("n", "gte", "10.5").matches(&t));
        assert!(!leaf("n", "lt", "10.5").matches(&t));
        assert!(leaf("n", "lte", "10.500").matches(&t));
        assert!(!leaf("team", "gt", "1").matches(&t), "not a number");
        let mut ex = leaf("team", "ex", "");
        assert!(ex.matches(&t));
        ex.cmp = "nex".to_owned();
        assert!(!ex.matches(&t));
        let within = FilterNode {
            key: "team".to_owned(),
            cmp: "in".to_owned(),
            vals: vec!["ops".to_owned(), "eng".to_owned()],
            ..FilterNode::default()
        };
        assert!(within.matches(&t));
        let outside = FilterNode {
            cmp: "nin".to_owned(),
            ..within.clone()
        };
        assert!(!outside.matches(&t));
        assert!(!within.matches(&tags(&[])));
    }

    #[test]
    fn operators_combine_their_nodes() {
        let t = tags(&[("team", "eng"), ("level", "3")]);
        let and = FilterNode {
            op: "and".to_owned(),
            nodes: vec![leaf("team", "eq", "eng"), leaf("level", "gte", "3")],
            ..FilterNode::default()
        };
        assert!(and.validate().is_ok());
        assert!(and.matches(&t));
        assert!(!and.matches(&tags(&[("team", "eng"), ("level", "2")])));
        let or = FilterNode {
            op: "or".to_owned(),
            nodes: vec![leaf("team", "eq", "ops"), leaf("level", "eq", "3")],
            ..FilterNode::default()
        };
        assert!(or.matches(&t));
        let not = FilterNode {
            op: "not".to_owned(),
            nodes: vec![or],
            ..FilterNode::default()
        };
        assert!(!not.matches(&t));
    }

    #[test]
    fn malformed_filters_are_refused() {
        let bad = [
            leaf("team", "", "x"),
            leaf("team", "like", "x"),
            leaf("", "eq", "x"),
            leaf("team", "eq", ""),
            leaf("team", "ex", "x"),
            FilterNode {
                key: "team".to_owned(),
                cmp: "in".to_owned(),
                ..FilterNode::default()
            },
            FilterNode {
                op: "and".to_owned(),
                ..FilterNode::default()
            },
            FilterNode {
                op: "not".to_owned(),
                nodes: vec![leaf("a", "ex", ""), leaf("b", "ex", "")],
                ..FilterNode::default()
            },
            FilterNode {
                op: "xor".to_owned(),
                nodes: vec![leaf("a", "ex", "")],
                ..FilterNode::default()
            },
        ];
        for f in bad {
            assert!(f.validate().is_err(), "{f:?}");
        }
        let mut deep = leaf("a", "ex", "");
        for _ in 0..MAX_DEPTH {
            deep = FilterNode {
                op: "not".to_owned(),
                nodes: vec![deep],
                ..FilterNode::default()
            };
        }
        assert_eq!(deep.validate(), Err(InvalidFilter("nested too deep")));
        let wide = FilterNode {
            op: "or".to_owned(),
            nodes: vec![leaf("a", "ex", ""); MAX_NODES],
            ..FilterNode::default()
        };
        assert_eq!(wide.validate(), Err(InvalidFilter("too many nodes")));
    }

    #[test]
    fn decimals_compare_exactly() {
        use Ordering::*;
        for (a, b, want) in [
            ("1", "1.0", Some(Equal)),
            ("-0", "0", Some(Equal)),
            ("10", "9.999", Some(Greater)),
            ("-10", "-9", Some(Less)),
            ("0.1", "0.09", Some(Greater)),
            ("007", "7", Some(Equal)),
            (
                "12345678901234567890.1",
                "12345678901234567890.01",
                Some(Greater),
            ),
            ("1e3", "1", None),
            ("", "1", None),
            ("1.", "1", None),
            (".5", "1", None),
            ("abc", "1", None),
        ] {
            assert_eq!(compare_decimal(a, b), want, "{a} vs {b}");
        }
    }
}
