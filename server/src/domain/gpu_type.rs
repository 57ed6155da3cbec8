//! GPU type names and the one family rule that matches them ("A100" covers "A100-40G").

use super::DomainError;

/// A GPU type name as users, quotas and administrators write it ("A100", "A100-40G",
/// "H200-141G"): 1 to 64 letters, digits, `-`, `_` or `.`, so that every name a task can ask
/// for can also be allowed, declared and matched by family.
pub fn parse_gpu_type(field: &'static str, raw: &str) -> Result<String, DomainError> {
    let t = raw.trim();
    if !super::names::is_gpu_type(t) {
        return Err(DomainError::invalid(
            field,
            format!("{raw:?} is not a GPU type name"),
        ));
    }
    Ok(t.to_owned())
}

/// Which GPU types a quota allows: every type (no list), or those of the listed families.
/// Parsed once, from the API or from the database column, and asked through the rules below,
/// which use the scheduler's own family match ("A100" covers "A100-40G").
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AllowedGpuTypes(Option<Vec<String>>);

impl AllowedGpuTypes {
    /// Names are trimmed, kept once (ignoring case), and must look like GPU type names.
    pub fn parse(list: Option<&[String]>) -> Result<Self, DomainError> {
        let Some(list) = list else {
            return Ok(AllowedGpuTypes(None));
        };
        if list.len() > 64 {
            return Err(DomainError::invalid(
                "allowed_gpu_types",
                "at most 64 GPU types",
            ));
        }
        let mut clean: Vec<String> = Vec::with_capacity(list.len());
        for t in list {
            let t = parse_gpu_type("allowed_gpu_types", t)?;
            if !clean.iter().any(|c| c.eq_ignore_ascii_case(&t)) {
                clean.push(t);
            }
        }
        Ok(AllowedGpuTypes(Some(clean)))
    }

    /// The list; `None` when every type is allowed.
    pub fn list(&self) -> Option<&[String]> {
        self.0.as_deref()
    }

    /// A GPU of type `t` (or every type of the family `t`) is allowed.
    pub fn covers(&self, t: &str) -> bool {
        self.list()
            .is_none_or(|l| l.iter().any(|a| autodl_scheduler::gpu_type_matches(a, t)))
    }

    /// A task asking for `requested` (a type, or a family) may run on some allowed type: the
    /// request names an allowed family or a type of one ("A100" allows "A100-40G"), or a
    /// family an allowed type is of (asking for "A100" with only "A100-40G" allowed: the
    /// scheduler then places it on the allowed variant only).
    pub fn admits_request(&self, requested: &str) -> bool {
        self.list().is_none_or(|l| {
            l.iter().any(|a| {
                autodl_scheduler::gpu_type_matches(a, requested)
                    || autodl_scheduler::gpu_type_matches(requested, a)
            })
        })
    }

    /// Every type listed here is allowed by `wider`; otherwise the first that is not. No list
    /// here narrows nothing: the wider list still applies.
    pub fn within<'a>(&'a self, wider: &Self) -> Result<(), &'a str> {
        match self.list() {
            None => Ok(()),
            Some(l) => match l.iter().find(|t| !wider.covers(t)) {
                Some(bad) => Err(bad),
                None => Ok(()),
            },
        }
    }

    /// As the database column holds it: a JSON array, or NULL for every type.
    pub fn to_column(&self) -> Option<String> {
        self.0
            .as_ref()
            .map(|l| serde_json::to_string(l).unwrap_or_else(|_| "[]".into()))
    }
}

impl TryFrom<Option<String>> for AllowedGpuTypes {
    type Error = String;

    fn try_from(column: Option<String>) -> Result<Self, Self::Error> {
        match column {
            None => Ok(AllowedGpuTypes(None)),
            Some(s) => serde_json::from_str(&s)
                .map(|l| AllowedGpuTypes(Some(l)))
                .map_err(|e| format!("allowed GPU types {s:?}: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_gpu_types_one_rule() {
        let a100 = AllowedGpuTypes::parse(Some(&["A100".into(), " a100 ".into()])).unwrap();
        assert_eq!(a100.list(), Some(&["A100".to_owned()][..]));
        assert!(a100.covers("A100-40G") && !a100.covers("A40"));
        let variant = AllowedGpuTypes::parse(Some(&["A100-40G".into()])).unwrap();
        assert!(variant.admits_request("A100") && !variant.covers("A100"));
        assert!(!variant.admits_request("H100"));
        assert_eq!(variant.within(&a100), Ok(()));
        assert_eq!(a100.within(&variant), Err("A100"));
        let all = AllowedGpuTypes::default();
        assert!(all.covers("anything") && all.within(&a100).is_ok());
        for t in [all, a100, variant] {
            assert_eq!(AllowedGpuTypes::try_from(t.to_column()), Ok(t));
        }
        assert!(AllowedGpuTypes::try_from(Some("not json".to_owned())).is_err());
        assert!(AllowedGpuTypes::parse(Some(&["A100;".into()])).is_err());
    }
}
