//! The value encodings of the `service.beta.kubernetes.io/aws-load-balancer-*` annotations,
//! as the AWS Load Balancer Controller reads them: lists `a,b`, maps `k1=v1,k2=v2`, numbers.

use std::collections::BTreeMap;

/// `a, b,,c` -> `[a, b, c]`.
pub fn parse_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// `k1=v1,k2=v2` -> a map; a key without `=` or an empty key is an error, as is a repeated key.
pub fn parse_map(value: &str) -> Result<BTreeMap<String, String>, String> {
    let mut map = BTreeMap::new();
    for entry in parse_list(value) {
        let (k, v) = entry
            .split_once('=')
            .ok_or_else(|| format!("{entry:?} is not key=value"))?;
        let k = k.trim();
        if k.is_empty() {
            return Err(format!("{entry:?} has an empty key"));
        }
        if map.insert(k.to_string(), v.trim().to_string()).is_some() {
            return Err(format!("key {k:?} is given twice"));
        }
    }
    Ok(map)
}

pub fn parse_u16(value: &str) -> Option<u16> {
    value.trim().parse().ok()
}

pub fn parse_u8(value: &str) -> Option<u8> {
    value.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_maps() {
        assert_eq!(parse_list(" a, b,,c "), vec!["a", "b", "c"]);
        assert!(parse_list("").is_empty());
        let m = parse_map("a=1, b = two,c=").unwrap();
        assert_eq!(m.get("a").map(String::as_str), Some("1"));
        assert_eq!(m.get("b").map(String::as_str), Some("two"));
        assert_eq!(m.get("c").map(String::as_str), Some(""));
        assert!(parse_map("a").is_err());
        assert!(parse_map("=1").is_err());
        assert!(parse_map("a=1,a=2").is_err());
        assert_eq!(parse_u16(" 8080 "), Some(8080));
        assert_eq!(parse_u16("70000"), None);
    }
}
