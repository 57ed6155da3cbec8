//! Who signs in: an email address, a password strong enough to keep, and the names people
//! give organizations and keys.

use super::DomainError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Email(String);

impl Email {
    /// Emails compare case-insensitively and by their NFKC form, so that look-alikes
    /// (full-width letters, ligatures) cannot make a second account for the same address.
    /// Quoted local parts and comments are refused: no mail system our users have needs them,
    /// and they make one mailbox spellable in many ways.
    pub fn parse(raw: &str) -> Result<Email, DomainError> {
        use unicode_normalization::UnicodeNormalization;
        let s: String = raw.trim().nfkc().collect::<String>().to_lowercase();
        if s.is_empty() {
            return Err(DomainError::invalid("email", "email is required"));
        }
        if s.len() > 254 {
            return Err(DomainError::invalid(
                "email",
                "email is longer than 254 characters",
            ));
        }
        let invalid =
            || DomainError::invalid("email", format!("{s:?} is not a valid email address"));
        if s.contains(['"', '(', ')', '\\', ' ']) || s.chars().any(char::is_control) {
            return Err(DomainError::invalid(
                "email",
                format!("{s:?} is not a plain email address (no quotes, comments or spaces)"),
            ));
        }
        if !email_address::EmailAddress::is_valid(&s) || s.matches('@').count() != 1 {
            return Err(invalid());
        }
        let domain = s.rsplit('@').next().unwrap_or_default();
        if !domain.contains('.') && domain != "localhost" {
            return Err(invalid());
        }
        Ok(Email(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

pub struct Password(String);

impl Password {
    pub const MIN_LEN: usize = 10;
    pub const MAX_LEN: usize = 128;
    /// zxcvbn's "safely unguessable" (about 10^10 guesses): dictionary words with a year or
    /// a capital and a digit (`Password12`, `Summer2024`) score lower.
    pub const MIN_SCORE: u8 = 3;

    pub fn parse(raw: &str, email: Option<&Email>) -> Result<Password, DomainError> {
        let n = raw.chars().count();
        if n < Self::MIN_LEN {
            return Err(DomainError::invalid(
                "password",
                format!("password must be at least {} characters", Self::MIN_LEN),
            ));
        }
        if n > Self::MAX_LEN {
            return Err(DomainError::invalid(
                "password",
                format!("password must be at most {} characters", Self::MAX_LEN),
            ));
        }
        let mut inputs: Vec<&str> = vec!["autodl"];
        if let Some(e) = email {
            inputs.push(e.as_str());
            inputs.extend(e.as_str().split(['@', '.', '-', '_', '+']));
        }
        let estimate = zxcvbn::zxcvbn(raw, &inputs);
        if u8::from(estimate.score()) < Self::MIN_SCORE {
            let hint = estimate
                .feedback()
                .map(|f| {
                    let mut parts: Vec<String> =
                        f.warning().map(|w| w.to_string()).into_iter().collect();
                    parts.extend(f.suggestions().iter().map(|s| s.to_string()));
                    parts.join(" ")
                })
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "Add more words or characters that are hard to guess.".into());
            return Err(DomainError::invalid(
                "password",
                format!("password is too weak (easy to guess): {hint}"),
            ));
        }
        Ok(Password(raw.to_owned()))
    }

    pub fn into_inner(self) -> String {
        self.0
    }
}

/// A human-readable name (organization, API key): trimmed, 1..=max printable characters.
pub fn parse_name(field: &'static str, raw: &str, max: usize) -> Result<String, DomainError> {
    let s = raw.trim();
    if s.is_empty() {
        return Err(DomainError::invalid(field, format!("{field} is required")));
    }
    if s.chars().count() > max {
        return Err(DomainError::invalid(
            field,
            format!("{field} must be at most {max} characters"),
        ));
    }
    if s.chars().any(char::is_control) {
        return Err(DomainError::invalid(
            field,
            format!("{field} must not contain control characters"),
        ));
    }
    Ok(s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The document's email pattern promises what the account rules take: an address a
        /// request check lets through is never refused by the handler afterwards.
        #[test]
        fn every_email_the_document_allows_is_an_email(
            email in proptest::string::string_regex(
                crate::domain::names::EMAIL.trim_start_matches('^').trim_end_matches('$')
            ).unwrap()
        ) {
            proptest::prop_assert!(Email::parse(&email).is_ok(), "{email:?}");
        }
    }

    #[test]
    fn long_local_parts_are_in_the_document() {
        let pattern = regex::Regex::new(crate::domain::names::EMAIL).unwrap();
        for ok in [
            "a.very.long.name@example.com",
            "christopher-alexander-montgomery@university.example.edu",
            "firstname.lastname+notebooks@lab.example.org",
        ] {
            assert!(pattern.is_match(ok), "{ok}");
            assert!(Email::parse(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn emails() {
        assert_eq!(
            Email::parse(" Ada@Example.COM ").unwrap().as_str(),
            "ada@example.com"
        );
        for bad in [
            "",
            "ada",
            "ada@",
            "@example.com",
            "a b@example.com",
            "ada@example",
            "\"ada\"@example.com",
            "\"a@b\"@example.com",
            "ada(comment)@example.com",
            "ada@@example.com",
        ] {
            assert!(Email::parse(bad).is_err(), "{bad:?} accepted");
        }
        // Full-width letters are the same address as their ASCII form.
        assert_eq!(
            Email::parse("ａｄａ@ｅｘａｍｐｌｅ.ｃｏｍ")
                .unwrap()
                .as_str(),
            "ada@example.com"
        );
    }

    #[test]
    fn passwords() {
        // What the suite, the README and the benches use must stay acceptable.
        for ok in [
            "correct-horse-battery-7",
            "Tr41n-all-the-things",
            "Operat0r-secret!",
            "Resear-cher-2024!",
            "Brand-new-pass-9",
            "Bench-passw0rd-1",
            "Dr41n-the-rack-now",
            "N3w-operator-pass",
            "a-long-Passw0rd",
        ] {
            assert!(Password::parse(ok, None).is_ok(), "{ok:?} refused");
        }
        for weak in [
            "short1!",
            "aaaaaaaaaaaaaaaa",
            "abcdefghijkl",
            "1111111111a",
            "Password12",
            "Summer2024",
            "Qwerty123456",
            "iloveyou2024",
        ] {
            assert!(Password::parse(weak, None).is_err(), "{weak:?} accepted");
        }
        let e = Email::parse("grace.hopper@example.com").unwrap();
        assert!(Password::parse("grace.hopper@example.com", Some(&e)).is_err());
        let msg = match Password::parse("Summer2024", None) {
            Err(DomainError::Invalid { message, .. }) => message,
            other => panic!("{:?}", other.is_ok()),
        };
        assert!(msg.contains("too weak"), "{msg}");
    }
}
