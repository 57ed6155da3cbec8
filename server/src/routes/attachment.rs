//! The `Content-Disposition` of a download: the browser saves the body as a file under the name
//! given, whatever characters it has.

use actix_web::http::header::{
    Charset, ContentDisposition, DispositionParam, DispositionType, ExtendedValue,
};

/// `attachment` named `name`. A name that is not plain ASCII goes whole as `filename*` (RFC
/// 6266 with RFC 8187's UTF-8 encoding, which every current browser reads), beside an ASCII
/// `filename` for clients that read only that: its other characters and any control
/// character become `_` (a header may not hold them), and quotes are escaped by actix.
pub fn attachment(name: &str) -> ContentDisposition {
    let ascii: String = name
        .chars()
        .map(|c| {
            if c.is_ascii() && !c.is_ascii_control() {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut parameters = vec![DispositionParam::Filename(ascii.clone())];
    if ascii != name {
        parameters.push(DispositionParam::FilenameExt(ExtendedValue {
            charset: Charset::Ext("UTF-8".into()),
            language_tag: None,
            value: name.as_bytes().to_vec(),
        }));
    }
    ContentDisposition {
        disposition: DispositionType::Attachment,
        parameters,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::TryIntoHeaderValue;

    fn header(name: &str) -> String {
        attachment(name)
            .try_into_value()
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned()
    }

    #[test]
    fn any_name_arrives_whole() {
        assert_eq!(header("loss.csv"), "attachment; filename=\"loss.csv\"");
        assert_eq!(
            header("损失.csv"),
            "attachment; filename=\"__.csv\"; filename*=UTF-8''%E6%8D%9F%E5%A4%B1.csv"
        );
        assert_eq!(
            header("a\"b\\c.txt"),
            "attachment; filename=\"a\\\"b\\\\c.txt\""
        );
        let odd = header("line\r\nSet-Cookie: x=1");
        assert!(!odd.contains('\r') && !odd.contains('\n'), "{odd}");
        let parsed = ContentDisposition::from_raw(
            &actix_web::http::header::HeaderValue::from_str(&header("Übung 1.pt")).unwrap(),
        )
        .unwrap();
        assert_eq!(
            parsed.get_filename_ext().unwrap().value,
            "Übung 1.pt".as_bytes()
        );
    }
}
