use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The tags of a message: string keys mapped to string values, stored
/// with the message and delivered with it (Centrifugo's publication
/// `tags`, `map<string, string>` in `client.proto` of
/// centrifugal/protocol). Most messages have none; an empty set costs no
/// allocation, and cloning a message shares its tags.
///
/// Keys are kept in byte order, so [`Tags::to_json`] is one canonical text
/// per set of tags (what the storage keeps and what an idempotency digest
/// covers). Serializes as a JSON object of strings (`{}` when empty).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Tags(Option<Arc<BTreeMap<String, String>>>);

impl Tags {
    /// The tags of `map`; an empty map is no tags.
    pub fn new(map: BTreeMap<String, String>) -> Self {
        if map.is_empty() {
            Self(None)
        } else {
            Self(Some(Arc::new(map)))
        }
    }

    /// True when there are no tags.
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The tags in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0
            .iter()
            .flat_map(|m| m.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    /// The value of `key`, if tagged.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.as_ref()?.get(key).map(String::as_str)
    }

    /// The UTF-8 length of every key and value together, in bytes: what the
    /// tags add to a message's size when it is held to a size limit.
    pub fn byte_len(&self) -> usize {
        self.iter().map(|(k, v)| k.len() + v.len()).sum()
    }

    /// The tags as one canonical JSON object text (keys in byte order, no
    /// whitespace), `None` when there are none: the form the storage keeps.
    pub fn to_json(&self) -> Option<String> {
        let map = self.0.as_ref()?;
        // A map of strings always serializes.
        serde_json::to_string(map.as_ref()).ok()
    }

    /// Tags from the text [`Tags::to_json`] made.
    ///
    /// # Errors
    /// The JSON error when `text` is not an object of strings.
    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str::<BTreeMap<String, String>>(text).map(Self::new)
    }
}

impl From<BTreeMap<String, String>> for Tags {
    fn from(map: BTreeMap<String, String>) -> Self {
        Self::new(map)
    }
}

impl FromIterator<(String, String)> for Tags {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        Self::new(iter.into_iter().collect())
    }
}

impl std::fmt::Debug for Tags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Serialize for Tags {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for Tags {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        BTreeMap::<String, String>::deserialize(d).map(Self::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(pairs: &[(&str, &str)]) -> Tags {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_json_form_is_canonical_and_round_trips() {
        let t = tags(&[("b", "2"), ("a", "1")]);
        assert_eq!(t.to_json().as_deref(), Some(r#"{"a":"1","b":"2"}"#));
        assert_eq!(Tags::from_json(r#"{ "b": "2", "a": "1" }"#).unwrap(), t);
        assert_eq!(t.get("a"), Some("1"));
        assert_eq!(t.byte_len(), 4);
        assert_eq!(serde_json::to_string(&t).unwrap(), r#"{"a":"1","b":"2"}"#);
    }

    #[test]
    fn no_tags_is_empty_and_has_no_stored_form() {
        let none = Tags::default();
        assert!(none.is_empty());
        assert_eq!(none.to_json(), None);
        assert_eq!(Tags::new(BTreeMap::new()), none);
        assert_eq!(Tags::from_json("{}").unwrap(), none);
        assert_eq!(serde_json::to_string(&none).unwrap(), "{}");
        assert!(Tags::from_json(r#"{"a":1}"#).is_err());
        assert!(Tags::from_json("[]").is_err());
    }
}
