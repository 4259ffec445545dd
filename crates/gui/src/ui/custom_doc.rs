//! The custom model's preset document (an edited preset, an imported `config.json`, a
//! captured graph), shared between the state and the caches keyed by it.

use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A custom model's JSON document behind a shared pointer: a clone copies the pointer, and
/// two handles to one document compare equal without walking it. The planner's caches
/// compare the state's document with the one they were built from on every frame; a captured
/// graph is megabytes of JSON, whose clone and comparison took ~50 ms a frame
/// (`frame_time_with_a_captured_model`). Serialized as the document itself.
#[derive(Debug, Clone)]
pub struct CustomDoc(Arc<serde_json::Value>);

impl CustomDoc {
    /// The document.
    pub fn value(&self) -> &serde_json::Value {
        &self.0
    }
}

impl PartialEq for CustomDoc {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

impl std::ops::Deref for CustomDoc {
    type Target = serde_json::Value;

    fn deref(&self) -> &serde_json::Value {
        &self.0
    }
}

/// The document as JSON text.
impl std::fmt::Display for CustomDoc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl From<serde_json::Value> for CustomDoc {
    fn from(v: serde_json::Value) -> Self {
        CustomDoc(Arc::new(v))
    }
}

impl Serialize for CustomDoc {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for CustomDoc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde_json::Value::deserialize(d).map(CustomDoc::from)
    }
}

#[cfg(test)]
mod tests {
    use super::CustomDoc;

    #[test]
    fn clones_share_the_document_and_equal_documents_compare_equal() {
        let a = CustomDoc::from(serde_json::json!({"id": "custom", "params": {"n_layer": 2}}));
        let b = a.clone();
        assert!(std::ptr::eq(a.value(), b.value()));
        assert_eq!(a, b);
        let c = CustomDoc::from(serde_json::json!({"id": "custom", "params": {"n_layer": 2}}));
        assert_eq!(a, c);
        let d = CustomDoc::from(serde_json::json!({"id": "custom", "params": {"n_layer": 3}}));
        assert_ne!(a, d);
    }

    #[test]
    fn it_serializes_as_the_document_itself() {
        let v = serde_json::json!({"id": "custom", "family": "gpt2"});
        let doc = CustomDoc::from(v.clone());
        let text = serde_json::to_string(&doc).expect("serialize");
        assert_eq!(text, serde_json::to_string(&v).expect("serialize"));
        let back: CustomDoc = serde_json::from_str(&text).expect("deserialize");
        assert_eq!(back.value(), &v);
    }
}
