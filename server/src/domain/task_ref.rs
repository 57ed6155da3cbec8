//! How people name a task: its id, its number in the organization, a prefix of its id or its
//! name.

/// What a caller wrote where a task is meant (an API path, `autodl status …`, a URL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskRef {
    /// A whole id: the task itself, read without a search.
    Id(String),
    /// `#412` or `412`: its number in the organization.
    Number(i64),
    /// At least four characters of an id (hex digits and dashes), or a name that looks like
    /// one: whichever single task has it.
    PrefixOrName(String),
    /// A task's name, which only that task of the organization has.
    Name(String),
}

/// Fewer characters of an id than this are too likely to be shared to mean one task.
pub const MIN_PREFIX: usize = 4;

impl TaskRef {
    /// Never fails: anything that is not an id or a number is a prefix or a name, which the
    /// store then finds or not.
    pub fn parse(raw: &str) -> TaskRef {
        let raw = raw.trim();
        if raw.len() == 36 && uuid::Uuid::try_parse(raw).is_ok() {
            return TaskRef::Id(raw.to_ascii_lowercase());
        }
        let digits = raw.strip_prefix('#').unwrap_or(raw);
        // Numbers never start with 0; ids (time-ordered) do for decades: `0197` is a prefix.
        let prefix_like = !raw.starts_with('#') && digits.starts_with('0');
        if !digits.is_empty()
            && !prefix_like
            && digits.len() <= 15
            && digits.bytes().all(|b| b.is_ascii_digit())
        {
            if let Ok(n) = digits.parse::<i64>() {
                return TaskRef::Number(n);
            }
        }
        if raw.len() >= MIN_PREFIX
            && raw.len() < 36
            && raw.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
        {
            return TaskRef::PrefixOrName(raw.to_owned());
        }
        TaskRef::Name(raw.to_owned())
    }

    /// How the refusal names what was asked for when no task answers to it: "no such task",
    /// as for an id, and what was looked for.
    pub fn describe(&self) -> String {
        match self {
            TaskRef::Id(id) => format!("no such task: {id}"),
            TaskRef::Number(n) => format!("no such task: #{n}"),
            TaskRef::PrefixOrName(s) => {
                format!("no such task: no id starts with '{s}' and no task is named so")
            }
            TaskRef::Name(s) => format!("no such task: none is named '{s}'"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_numbers_prefixes_and_names() {
        let id = "01a24554-63d2-7abc-8def-0123456789ab";
        assert_eq!(TaskRef::parse(id), TaskRef::Id(id.into()));
        assert_eq!(
            TaskRef::parse(&id.to_uppercase()),
            TaskRef::Id(id.into()),
            "an id in capitals is the same id"
        );
        assert_eq!(TaskRef::parse("#412"), TaskRef::Number(412));
        assert_eq!(TaskRef::parse("412"), TaskRef::Number(412));
        assert_eq!(
            TaskRef::parse("01a24554-63d2"),
            TaskRef::PrefixOrName("01a24554-63d2".into())
        );
        assert_eq!(TaskRef::parse("cafe"), TaskRef::PrefixOrName("cafe".into()));
        assert_eq!(TaskRef::parse("abc"), TaskRef::Name("abc".into()));
        assert_eq!(TaskRef::parse("prep"), TaskRef::Name("prep".into()));
        assert_eq!(TaskRef::parse("#"), TaskRef::Name("#".into()));
        assert_eq!(
            TaskRef::parse("99999999999999999999"),
            TaskRef::PrefixOrName("99999999999999999999".into()),
            "a number too long to be one is only a name or a prefix"
        );
        assert_eq!(TaskRef::parse("#12a"), TaskRef::Name("#12a".into()));
        assert_eq!(
            TaskRef::parse("0197"),
            TaskRef::PrefixOrName("0197".into()),
            "digits that start with 0 begin an id"
        );
        assert_eq!(TaskRef::parse("#0197"), TaskRef::Number(197));
        assert_eq!(TaskRef::parse("0"), TaskRef::Name("0".into()));
        for what in ["#3", "prep", "0197", "01a24554-63d2-7abc-8def-0123456789ab"] {
            assert!(TaskRef::parse(what).describe().starts_with("no such task"));
        }
    }
}
