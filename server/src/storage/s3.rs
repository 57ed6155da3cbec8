//! S3-compatible object storage (AWS, MinIO, Ceph, ...) through aws-sdk-s3. Large objects go up
//! as multipart uploads, which S3 makes visible only on completion.

use std::time::Duration;

use actix_web::web::Bytes;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream as AwsBody;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use aws_sdk_s3::Client;
use aws_smithy_http_client::tls;

use super::{ByteStream, ObjectMeta, ObjectStore, StorageError, StorageResult, Upload, PART_SIZE};
use crate::config::Settings;

pub struct S3Store {
    client: Client,
    endpoint: String,
}

impl S3Store {
    pub fn new(s: &Settings) -> S3Store {
        let access = s
            .storage_access_key_id
            .clone()
            .or_else(|| std::env::var("AWS_ACCESS_KEY_ID").ok());
        let secret = s
            .storage_secret_access_key
            .clone()
            .or_else(|| std::env::var("AWS_SECRET_ACCESS_KEY").ok());
        let https = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(
                tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let mut b = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .http_client(https)
            .region(Region::new(s.storage_region.clone()))
            .force_path_style(s.storage_path_style)
            .timeout_config(
                aws_sdk_s3::config::timeout::TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .operation_attempt_timeout(Duration::from_secs(300))
                    .build(),
            );
        if let Some(e) = &s.storage_endpoint {
            b = b.endpoint_url(e);
        }
        if let (Some(a), Some(k)) = (access, secret) {
            b = b.credentials_provider(Credentials::new(a, k, None, None, "autodl-config"));
        }
        S3Store {
            client: Client::from_conf(b.build()),
            endpoint: s
                .storage_endpoint
                .clone()
                .unwrap_or_else(|| format!("AWS {}", s.storage_region)),
        }
    }
}

fn map_err<E, R>(bucket: &str, e: SdkError<E, R>) -> StorageError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    let text = DisplayErrorContext(&e).to_string();
    match &e {
        SdkError::ServiceError(se) => {
            let code = se.err().code().unwrap_or_default();
            match code {
                "NoSuchBucket" => StorageError::NoBucket(bucket.to_owned()),
                "NoSuchKey" | "NotFound" => StorageError::NotFound,
                "SlowDown" | "InternalError" | "ServiceUnavailable" | "RequestTimeout" => {
                    StorageError::Unavailable(text)
                }
                _ => StorageError::Other(text),
            }
        }
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) | SdkError::ResponseError(_) => {
            StorageError::Unavailable(text)
        }
        _ => StorageError::Other(text),
    }
}

struct S3Upload {
    client: Client,
    bucket: String,
    key: String,
    buf: Vec<u8>,
    upload_id: Option<String>,
    parts: Vec<CompletedPart>,
    size: u64,
}

impl S3Upload {
    async fn flush_part(&mut self) -> StorageResult<()> {
        if self.upload_id.is_none() {
            let out = self
                .client
                .create_multipart_upload()
                .bucket(&self.bucket)
                .key(&self.key)
                .send()
                .await
                .map_err(|e| map_err(&self.bucket, e))?;
            self.upload_id = Some(
                out.upload_id()
                    .ok_or_else(|| StorageError::Other("no upload id".into()))?
                    .to_owned(),
            );
        }
        let number = self.parts.len() as i32 + 1;
        let body = std::mem::take(&mut self.buf);
        let out = self
            .client
            .upload_part()
            .bucket(&self.bucket)
            .key(&self.key)
            .upload_id(self.upload_id.as_deref().unwrap_or_default())
            .part_number(number)
            .body(AwsBody::from(body))
            .send()
            .await
            .map_err(|e| map_err(&self.bucket, e))?;
        self.parts.push(
            CompletedPart::builder()
                .set_e_tag(out.e_tag().map(str::to_owned))
                .part_number(number)
                .build(),
        );
        Ok(())
    }
}

#[async_trait::async_trait]
impl Upload for S3Upload {
    async fn write(&mut self, chunk: Bytes) -> StorageResult<()> {
        self.size += chunk.len() as u64;
        self.buf.extend_from_slice(&chunk);
        // S3 allows 10,000 parts: parts grow every thousand, so objects up to ~2.5 TB fit.
        let part = PART_SIZE << (self.parts.len() / 1000).min(5);
        if self.buf.len() >= part {
            self.flush_part().await?;
        }
        Ok(())
    }

    async fn finish(mut self: Box<Self>) -> StorageResult<u64> {
        if self.upload_id.is_none() {
            let body = std::mem::take(&mut self.buf);
            self.client
                .put_object()
                .bucket(&self.bucket)
                .key(&self.key)
                .body(AwsBody::from(body))
                .send()
                .await
                .map_err(|e| map_err(&self.bucket, e))?;
            return Ok(self.size);
        }
        if !self.buf.is_empty() {
            if let Err(e) = self.flush_part().await {
                self.abort().await;
                return Err(e);
            }
        }
        let parts = std::mem::take(&mut self.parts);
        let done = self
            .client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(&self.key)
            .upload_id(self.upload_id.as_deref().unwrap_or_default())
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            )
            .send()
            .await;
        match done {
            Ok(_) => Ok(self.size),
            Err(e) => {
                let err = map_err(&self.bucket, e);
                self.abort().await;
                Err(err)
            }
        }
    }

    async fn abort(self: Box<Self>) {
        if let Some(id) = &self.upload_id {
            let _ = self
                .client
                .abort_multipart_upload()
                .bucket(&self.bucket)
                .key(&self.key)
                .upload_id(id)
                .send()
                .await;
        }
    }
}

#[async_trait::async_trait]
impl ObjectStore for S3Store {
    fn describe(&self) -> String {
        format!("S3 at {}", self.endpoint)
    }

    async fn bucket_exists(&self, bucket: &str) -> StorageResult<bool> {
        match self.client.head_bucket().bucket(bucket).send().await {
            Ok(_) => Ok(true),
            Err(SdkError::ServiceError(se)) if se.raw().status().as_u16() == 404 => Ok(false),
            Err(e) => Err(map_err(bucket, e)),
        }
    }

    async fn start_upload(&self, bucket: &str, key: &str) -> StorageResult<Box<dyn Upload>> {
        Ok(Box::new(S3Upload {
            client: self.client.clone(),
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            buf: Vec::new(),
            upload_id: None,
            parts: Vec::new(),
            size: 0,
        }))
    }

    async fn get(&self, bucket: &str, key: &str) -> StorageResult<(u64, ByteStream)> {
        let out = self
            .client
            .get_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| map_err(bucket, e))?;
        let size = out.content_length().unwrap_or(0).max(0) as u64;
        let reader = out.body.into_async_read();
        let stream = tokio_util::io::ReaderStream::with_capacity(reader, 256 * 1024);
        Ok((size, Box::pin(stream)))
    }

    async fn size(&self, bucket: &str, key: &str) -> StorageResult<Option<u64>> {
        match self
            .client
            .head_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
        {
            Ok(out) => Ok(Some(out.content_length().unwrap_or(0).max(0) as u64)),
            Err(e) => match map_err(bucket, e) {
                StorageError::NotFound => Ok(None),
                other => Err(other),
            },
        }
    }

    /// One key is enough to know; listing a whole dataset at each submission would not do.
    async fn any_under(&self, bucket: &str, prefix: &str) -> StorageResult<bool> {
        let page = self
            .client
            .list_objects_v2()
            .bucket(bucket)
            .prefix(prefix)
            .max_keys(1)
            .send()
            .await
            .map_err(|e| map_err(bucket, e))?;
        Ok(!page.contents().is_empty())
    }

    async fn list(&self, bucket: &str, prefix: &str) -> StorageResult<Vec<ObjectMeta>> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self
                .client
                .list_objects_v2()
                .bucket(bucket)
                .prefix(prefix)
                .set_continuation_token(token.take())
                .send()
                .await
                .map_err(|e| map_err(bucket, e))?;
            for o in page.contents() {
                let Some(key) = o.key().and_then(|k| k.strip_prefix(prefix)) else {
                    continue;
                };
                out.push(ObjectMeta {
                    key: key.to_owned(),
                    size: o.size().unwrap_or(0).max(0) as u64,
                    etag: o.e_tag().unwrap_or_default().trim_matches('"').to_owned(),
                });
            }
            match page.next_continuation_token() {
                Some(t) if page.is_truncated().unwrap_or(false) => token = Some(t.to_owned()),
                _ => break,
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    async fn delete(&self, bucket: &str, key: &str) -> StorageResult<()> {
        self.client
            .delete_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| map_err(bucket, e))?;
        Ok(())
    }
}
