//! CSV downloads: every field quoted, and a leading formula character neutralised, because
//! these files are opened in spreadsheets and hold text that users chose.

pub fn field(s: &str) -> String {
    let s = if s.starts_with(['=', '+', '-', '@']) {
        format!("'{s}")
    } else {
        s.to_owned()
    };
    format!("\"{}\"", s.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_and_neutralised() {
        assert_eq!(field("a\"b"), "\"a\"\"b\"");
        assert_eq!(field("=1+1"), "\"'=1+1\"");
    }
}
