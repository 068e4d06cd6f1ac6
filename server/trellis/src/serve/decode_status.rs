//! Requests the server cannot decode are the caller's mistake: `INVALID_ARGUMENT`, not the
//! `INTERNAL` that tonic's protobuf codec answers (it cannot tell which side it decodes for).
//!
//! A decode failure happens before the service is called, so its status is the whole response
//! (a "trailers-only" response: `grpc-status` in the headers). [`fix_response`] rewrites
//! exactly those: `INTERNAL` with the message the codec or tonic's framing gives a request it
//! cannot read. `INTERNAL` from the engine itself is left alone.

use tonic::codegen::http;

/// How the messages of undecodable requests start: prost's decode error (a body that is not
/// the request message), tonic's framing (a bad compression flag) and a body with no message.
const DECODE_ERRORS: [&str; 3] = [
    "failed to decode Protobuf message",
    "protocol error: received message with invalid compression flag",
    "Missing request message",
];

/// Every response through [`fix_headers`]; the server applies it with tower's
/// `MapResponseLayer`.
pub(crate) fn fix_response<B>(mut response: http::Response<B>) -> http::Response<B> {
    fix_headers(response.headers_mut());
    response
}

/// `INTERNAL` for an undecodable request becomes `INVALID_ARGUMENT`.
fn fix_headers(headers: &mut http::HeaderMap) {
    if headers.get("grpc-status").map(|v| v.as_bytes()) != Some(b"13") {
        return;
    }
    let Some(message) = headers.get("grpc-message") else {
        return;
    };
    let message = percent_decode(message.as_bytes());
    if DECODE_ERRORS
        .iter()
        .any(|prefix| message.starts_with(prefix.as_bytes()))
    {
        headers.insert("grpc-status", http::HeaderValue::from_static("3"));
    }
}

/// gRPC percent-encodes `grpc-message`; bad escapes are kept as they are.
fn percent_decode(bytes: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let (Some(h), Some(l)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push(h << 4 | l);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(status: &str, message: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert("grpc-status", http::HeaderValue::from_str(status).unwrap());
        h.insert(
            "grpc-message",
            http::HeaderValue::from_str(message).unwrap(),
        );
        h
    }

    #[test]
    fn only_decode_failures_change() {
        let mut h = headers(
            "13",
            "failed%20to%20decode%20Protobuf%20message:%20invalid%20wire%20type",
        );
        fix_headers(&mut h);
        assert_eq!(h["grpc-status"], "3");

        let mut h = headers("13", "state%20store:%20disk%20I/O%20error");
        fix_headers(&mut h);
        assert_eq!(h["grpc-status"], "13");

        let mut h = headers("5", "failed%20to%20decode%20Protobuf%20message");
        fix_headers(&mut h);
        assert_eq!(h["grpc-status"], "5");
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode(b"a%20b%zz%4"), b"a b%zz%4");
    }
}
