//! A real S3 protocol server for tests and benchmarks: s3s-fs (an S3 implementation over a
//! folder) served over HTTP on a random local port, with signature checking switched on.

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;

pub const ACCESS_KEY: &str = "autodl-test-key";
pub const SECRET_KEY: &str = "autodl-test-secret";

pub struct S3Server {
    pub endpoint: String,
    pub root: tempfile::TempDir,
    handle: tokio::task::JoinHandle<()>,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// Starts the server with the given buckets (folders under its root).
pub async fn start(buckets: &[&str]) -> S3Server {
    let root = tempfile::tempdir().expect("tempdir");
    for b in buckets {
        std::fs::create_dir_all(root.path().join(b)).expect("bucket folder");
    }
    let fs = s3s_fs::FileSystem::new(root.path()).expect("s3s-fs");
    let mut b = S3ServiceBuilder::new(fs);
    b.set_auth(SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
    let service = b.build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
    let handle = tokio::spawn(async move {
        let http = ConnBuilder::new(TokioExecutor::new());
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                continue;
            };
            let conn = http
                .serve_connection(TokioIo::new(socket), service.clone())
                .into_owned();
            tokio::spawn(async move {
                let _ = conn.await;
            });
        }
    });
    S3Server {
        endpoint,
        root,
        handle,
    }
}

/// Points the server's settings at this S3 server, with `bucket` as the default bucket.
pub fn configure(s: &mut autodl_server::config::Settings, endpoint: &str, bucket: &str) {
    s.storage_url = format!("s3://{bucket}/autodl");
    s.storage_endpoint = Some(endpoint.to_owned());
    s.storage_region = "us-east-1".into();
    s.storage_path_style = true;
    s.storage_access_key_id = Some(ACCESS_KEY.into());
    s.storage_secret_access_key = Some(SECRET_KEY.into());
}
