//! What berth reads back from its own writes: the name and resourceVersion the API server gave.
//! The full object is not needed, and decoding it (managedFields included) would cost more than
//! sending the write.

use serde::Deserialize;

/// A write's response, read for its metadata only.
#[derive(Debug, Default, Deserialize)]
struct Written {
    #[serde(default)]
    metadata: WrittenMeta,
}

/// The metadata of a write's response.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WrittenMeta {
    pub(crate) name: Option<String>,
    pub(crate) resource_version: Option<String>,
}

/// Sends a write request built with `kube::core::Request`, tagged with `verb` for the client's
/// metrics and traces, and reads back only the metadata of the response.
pub(crate) async fn send_write(
    client: &kube::Client,
    mut request: http::Request<Vec<u8>>,
    verb: &'static str,
) -> Result<WrittenMeta, kube::Error> {
    request.extensions_mut().insert(verb);
    client.request::<Written>(request).await.map(|w| w.metadata)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_name_and_version_and_skips_the_rest() {
        let body = r#"{"kind":"EndpointSlice","metadata":{"name":"web-abcde","namespace":"ns",
            "resourceVersion":"42","managedFields":[{"manager":"x"}]},"endpoints":[{"addresses":["10.244.1.5"]}]}"#;
        let w: Written = serde_json::from_str(body).unwrap();
        assert_eq!(w.metadata.name.as_deref(), Some("web-abcde"));
        assert_eq!(w.metadata.resource_version.as_deref(), Some("42"));
        let empty: Written = serde_json::from_str("{}").unwrap();
        assert!(empty.metadata.name.is_none() && empty.metadata.resource_version.is_none());
    }
}
