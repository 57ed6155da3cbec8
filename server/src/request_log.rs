//! What the log says of each request: tracing-actix-web's span, and one event when the answer
//! is an error. A refusal (4xx: a wrong password, a missing field, a task of another
//! organization) is the caller's business and is said at debug level; a failure (5xx) is the
//! server's and is said as an error. (tracing-actix-web's own event said every 4xx as a
//! warning, a third of an ordinary day's log.)

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::ResponseError;
use tracing::Span;
use tracing_actix_web::{DefaultRootSpanBuilder, RootSpanBuilder};

/// The root span builder the server's `TracingLogger` uses.
pub struct RequestSpans;

impl RootSpanBuilder for RequestSpans {
    fn on_request_start(request: &ServiceRequest) -> Span {
        DefaultRootSpanBuilder::on_request_start(request)
    }

    fn on_request_end<B: MessageBody>(
        span: Span,
        outcome: &Result<ServiceResponse<B>, actix_web::Error>,
    ) {
        let error: Option<(StatusCode, &dyn ResponseError)> = match outcome {
            Ok(response) => response
                .response()
                .error()
                .map(|e| (response.status(), e.as_response_error())),
            Err(e) => Some((e.as_response_error().status_code(), e.as_response_error())),
        };
        if let Some((status, e)) = error {
            span.in_scope(|| {
                if status.is_server_error() {
                    tracing::error!(status = status.as_u16(), "request failed: {e:?}");
                } else {
                    tracing::debug!(status = status.as_u16(), "request refused: {e}");
                }
            });
        }
        DefaultRootSpanBuilder::on_request_end(span, outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::{test, web, App, HttpResponse};
    use std::sync::{Arc, Mutex};
    use tracing_actix_web::TracingLogger;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[actix_web::test]
    async fn refusals_are_said_at_debug_level_and_failures_as_errors() {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let app = test::init_service(
            App::new()
                .wrap(TracingLogger::<RequestSpans>::new())
                .route(
                    "/missing",
                    web::get().to(|| async {
                        Err::<HttpResponse, _>(crate::error::ApiError::NotFound(
                            "no such task".into(),
                        ))
                    }),
                )
                .route(
                    "/broken",
                    web::get().to(|| async {
                        Err::<HttpResponse, _>(crate::error::ApiError::Internal(anyhow::anyhow!(
                            "the disk is on fire"
                        )))
                    }),
                ),
        )
        .await;
        for path in ["/missing", "/broken"] {
            test::call_service(&app, test::TestRequest::get().uri(path).to_request()).await;
        }
        let log = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let line = |needle: &str| {
            log.lines()
                .find(|l| l.contains(needle))
                .unwrap_or_else(|| panic!("no {needle:?} in {log}"))
                .to_owned()
        };
        assert!(line("request refused").contains("DEBUG"), "{log}");
        assert!(line("request failed").contains("ERROR"), "{log}");
        assert!(!log.contains(" WARN "), "{log}");
    }
}
