//! Peer passwords (TCP MD5, RFC 2385) from Secrets: read and checked before they reach FRR's
//! configuration, and kept out of everything berth prints.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;

/// The Secret key holding the password (`kubernetes.io/basic-auth`, as MetalLB reads it).
pub const PASSWORD_KEY: &str = "password";
/// The longest TCP MD5 key Linux accepts (`TCP_MD5SIG_MAXKEYLEN`).
pub const MAX_PASSWORD_LEN: usize = 80;
/// What stands in for a password in any text berth logs or reports.
pub const REDACTED: &str = "<redacted>";

/// The password in `secret`, or why it cannot be used. It becomes one word of an FRR
/// configuration line, so only printable ASCII without spaces is accepted: no line break or
/// second word can reach the configuration.
pub fn password_from_secret(secret: &Secret) -> Result<String, String> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(PASSWORD_KEY))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(PASSWORD_KEY))
                .map(|s| s.clone().into_bytes())
        })
        .ok_or_else(|| format!("has no {PASSWORD_KEY:?} key"))?;
    check_password(&bytes).map_err(|problem| format!("its {PASSWORD_KEY:?} {problem}"))
}

/// The password as FRR may take it, or what is wrong with it (never the password itself).
pub fn check_password(bytes: &[u8]) -> Result<String, String> {
    if bytes.is_empty() {
        return Err("is empty".into());
    }
    if bytes.len() > MAX_PASSWORD_LEN {
        return Err(format!(
            "is {} bytes long; TCP MD5 keys are at most {MAX_PASSWORD_LEN}",
            bytes.len()
        ));
    }
    if !bytes.iter().all(|b| b.is_ascii_graphic()) {
        return Err("holds a space, a control character or non-ASCII text".into());
    }
    Ok(String::from_utf8_lossy(bytes).into_owned())
}

/// `text` with every password in `passwords` replaced by [`REDACTED`], and the rest of any
/// line that sets a password (`... password X`) too, for text FRR's tools print.
pub fn redact(text: &str, passwords: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        match line.find(" password ") {
            Some(at) => {
                out.push_str(&line[..at]);
                out.push_str(" password ");
                out.push_str(REDACTED);
            }
            None => {
                let mut line = line.to_string();
                for password in passwords.values() {
                    line = line.replace(password.as_str(), REDACTED);
                }
                out.push_str(&line);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn mk_secret(password: Option<&[u8]>) -> Secret {
        Secret {
            data: password.map(|p| [(PASSWORD_KEY.to_string(), ByteString(p.to_vec()))].into()),
            ..Default::default()
        }
    }

    #[test]
    fn passwords_are_checked() {
        assert_eq!(
            password_from_secret(&mk_secret(Some(b"s3cr#t!"))),
            Ok("s3cr#t!".into())
        );
        let string_data = Secret {
            string_data: Some([(PASSWORD_KEY.to_string(), "abc".to_string())].into()),
            ..Default::default()
        };
        assert_eq!(password_from_secret(&string_data), Ok("abc".into()));
        for (bad, why) in [
            (None, "no \"password\" key"),
            (Some(&b""[..]), "is empty"),
            (Some(&b"two words"[..]), "a space"),
            (Some(&b"line\nbreak"[..]), "control character"),
            (Some("pässword".as_bytes()), "non-ASCII"),
            (Some(&[b'x'; 81][..]), "at most 80"),
        ] {
            let err = password_from_secret(&mk_secret(bad)).expect_err(why);
            assert!(err.contains(why), "{err} should say {why}");
            if let Some(bad) = bad.filter(|b| b.len() > 3) {
                assert!(
                    !err.contains(&*String::from_utf8_lossy(bad)),
                    "{err} repeats the password"
                );
            }
        }
        assert!(password_from_secret(&mk_secret(Some(&[b'x'; 80]))).is_ok());
    }

    #[test]
    fn redaction_hides_every_password() {
        let passwords: BTreeMap<String, String> =
            [("tor".to_string(), "hunter2".to_string())].into();
        let text = "line 1\n neighbor 198.18.0.1 password hunter2\nvtysh: hunter2 refused\n password hunter3";
        let out = redact(text, &passwords);
        assert!(!out.contains("hunter"), "{out}");
        assert_eq!(
            out,
            "line 1\n neighbor 198.18.0.1 password <redacted>\nvtysh: <redacted> refused\n password <redacted>"
        );
    }
}
