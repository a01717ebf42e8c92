//! A registry as a [`Source`] and a [`Sink`] of the copy engine. Retries live here, at the
//! transport, by one policy: a blob download that breaks resumes itself with a range request
//! (at the URL it was redirected to), an upload that fails starts again with a new session.

use super::auth::Scope;
use super::client::{status_error, Req};
use super::{repo_path, Mount, Registry, RegistryError};
use crate::store::retry::Tries;
use crate::store::{
    BlobStream, Have, OnBytes, Opener, RawManifest, Reference, Sink, Source, Store, StoreError,
};
use bytes::Bytes;
use futures_util::StreamExt;
use koord_base::oci::{Descriptor, Digest, ImageRef, Manifest};
use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use std::sync::{Arc, Mutex};

/// A registry as a store: repositories under `base` (`HOST[/PREFIX]`), or, with an empty
/// base, repositories named with their host (`ghcr.io/koordinator-sh/koordlet`).
#[derive(Clone)]
pub struct RegistryStore {
    reg: Arc<Registry>,
    base: String,
}

impl RegistryStore {
    /// The store of `base` (`HOST[/PREFIX]`, or empty: repositories carry their host).
    pub fn new(reg: Arc<Registry>, base: &str) -> RegistryStore {
        RegistryStore {
            reg,
            base: base.trim_end_matches('/').to_string(),
        }
    }

    /// The image reference of `repo` and `reference` in this store.
    pub fn image(&self, repo: &str, reference: &Reference) -> Result<ImageRef, StoreError> {
        let path = if self.base.is_empty() {
            repo.to_string()
        } else {
            format!("{}/{repo}", self.base)
        };
        ImageRef::parse(&reference.qualify(&path))
            .map_err(|e| StoreError::other(self.describe(), e))
    }

    fn blob_ref(&self, repo: &str, d: &Digest) -> Result<ImageRef, StoreError> {
        self.image(repo, &Reference::Digest(d.clone()))
    }
}

impl Store for RegistryStore {
    fn describe(&self) -> String {
        if self.base.is_empty() {
            "registry".into()
        } else {
            format!("registry {}", self.base)
        }
    }
}

impl Source for RegistryStore {
    async fn manifest(&self, repo: &str, reference: &Reference) -> Result<RawManifest, StoreError> {
        let r = self.image(repo, reference)?;
        let (bytes, digest, content_type) = self.reg.get_manifest_typed(&r).await?;
        let media_type = content_type
            .filter(|t| koord_base::oci::media::ALL_MANIFESTS.contains(&t.as_str()))
            .or_else(|| {
                Manifest::parse(&bytes, None)
                    .ok()
                    .map(|m| m.media_type().to_string())
            })
            .unwrap_or_default();
        Ok(RawManifest {
            bytes,
            digest,
            media_type,
        })
    }

    async fn blob(
        &self,
        repo: &str,
        desc: &Descriptor,
        offset: u64,
    ) -> Result<BlobStream, StoreError> {
        let r = self.blob_ref(repo, &desc.digest)?;
        Ok(self.reg.clone().blob_stream(r, desc.clone(), offset))
    }

    async fn referrers(&self, repo: &str, subject: &Digest) -> Result<Option<Bytes>, StoreError> {
        let r = self.blob_ref(repo, subject)?;
        Ok(self.reg.referrers(&r, subject).await?)
    }
}

impl Sink for RegistryStore {
    async fn blob_state(&self, repo: &str, desc: &Descriptor) -> Result<Have, StoreError> {
        let r = self.blob_ref(repo, &desc.digest)?;
        Ok(if self.reg.blob_exists(&r, desc).await? {
            Have::Complete
        } else {
            Have::Nothing
        })
    }

    async fn put_blob(
        &self,
        repo: &str,
        desc: &Descriptor,
        _offset: u64,
        data: &dyn Opener,
        on_bytes: &OnBytes,
    ) -> Result<(), StoreError> {
        let r = self.blob_ref(repo, &desc.digest)?;
        self.reg.push_blob(&r, desc, data, on_bytes).await
    }

    async fn mount_blob(
        &self,
        repo: &str,
        from_repo: &str,
        desc: &Descriptor,
    ) -> Result<bool, StoreError> {
        let r = self.blob_ref(repo, &desc.digest)?;
        let from = self.blob_ref(from_repo, &desc.digest)?;
        // A mount is an optimisation: refused (401/403) or not honoured (202, 404...), the blob
        // is uploaded instead. Some registries answer 201 and still lack the blob: look.
        Ok(self
            .reg
            .mount_blob(&r, &from.repository, &desc.digest)
            .await?
            == Mount::Mounted
            && self.reg.blob_exists(&r, desc).await?)
    }

    async fn has_manifest(
        &self,
        repo: &str,
        reference: &Reference,
        digest: &Digest,
    ) -> Result<bool, StoreError> {
        let r = self.image(repo, reference)?;
        match self.reg.get_manifest(&r).await {
            Ok((_, got)) => Ok(&got == digest),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Put the exact bytes: the digest the registry says it stored (or, when it says none, the
    /// one it serves back) must be theirs.
    async fn put_manifest(
        &self,
        repo: &str,
        reference: &Reference,
        m: &RawManifest,
    ) -> Result<(), StoreError> {
        let r = self.image(repo, reference)?;
        self.reg.put_manifest(&r, &m.bytes, &m.media_type).await?;
        Ok(())
    }
}

/// Where a blob download stands.
struct Download {
    reg: Arc<Registry>,
    r: ImageRef,
    desc: Descriptor,
    what: String,
    /// Next byte wanted.
    pos: u64,
    resp: Option<reqwest::Response>,
    /// Where the registry sent the GET (a resumed attempt asks there).
    redirected: Option<Url>,
    /// The tries of this download (a broken transfer is asked for again from `pos`).
    tries: Tries,
    /// `pos` when the current attempt began (progress does not spend a try).
    attempt_start: u64,
    /// Bytes still to drop from the response (a server that ignored the range).
    skip: u64,
}

impl Registry {
    /// A blob's bytes from `offset`, as a stream that resumes itself: a transfer that breaks is
    /// asked for again from the byte it stopped at (a range request, at the redirected URL),
    /// by the retry policy; only when the tries are spent does the stream end in an error.
    pub fn blob_stream(self: Arc<Self>, r: ImageRef, desc: Descriptor, offset: u64) -> BlobStream {
        let what = format!("blob {} of {}", desc.digest, r.repository);
        let state = Download {
            tries: Tries::new(&self.opts.retry, &what),
            reg: self,
            r,
            desc,
            what,
            pos: offset,
            resp: None,
            redirected: None,
            attempt_start: offset,
            skip: 0,
        };
        futures_util::stream::unfold(Some(state), |state| async move {
            let mut st = state?;
            loop {
                if st.pos >= st.desc.size {
                    return None;
                }
                let step: Result<Option<Bytes>, RegistryError> = match st.resp.as_mut() {
                    None => st.open().await.map(|()| None),
                    Some(resp) => match resp.chunk().await {
                        Ok(Some(chunk)) => Ok(Some(chunk)),
                        Ok(None) => Err(RegistryError::transport(
                            &st.r.registry,
                            &st.what,
                            format!(
                                "the stream ended after {} of {} bytes",
                                st.pos, st.desc.size
                            ),
                            String::new(),
                            true,
                        )),
                        Err(e) => Err(RegistryError::transport(
                            &st.r.registry,
                            &st.what,
                            format!(
                                "transfer broke after {} of {} bytes: {}",
                                st.pos,
                                st.desc.size,
                                crate::store::error_chain(&e)
                            ),
                            String::new(),
                            true,
                        )),
                    },
                };
                match step {
                    Ok(None) => continue,
                    Ok(Some(chunk)) if st.skip >= chunk.len() as u64 => {
                        st.skip -= chunk.len() as u64;
                        continue;
                    }
                    Ok(Some(mut chunk)) => {
                        if st.skip > 0 {
                            chunk = chunk.slice(st.skip as usize..);
                            st.skip = 0;
                        }
                        let left = st.desc.size - st.pos;
                        if chunk.len() as u64 > left {
                            chunk.truncate(left as usize);
                        }
                        st.pos += chunk.len() as u64;
                        return Some((Ok(chunk), Some(st)));
                    }
                    Err(e) => {
                        st.resp = None;
                        st.skip = 0;
                        if st.pos > st.attempt_start {
                            // Progress was made: this failure does not spend a try.
                            st.tries.progressed();
                        }
                        st.attempt_start = st.pos;
                        let Some(wait) = st.tries.failed(e.failure()) else {
                            let mut e = e;
                            e.set_attempts(st.tries.made());
                            return Some((Err(e.into()), None));
                        };
                        st.reg.report(&e, &st.what, st.tries.made(), wait);
                        tokio::time::sleep(wait).await;
                    }
                }
            }
        })
        .boxed()
    }

    /// Upload a blob whose bytes `data` opens, in one monolithic PUT streamed from it. A failed
    /// upload starts again with a new session (opening `data` again), by the retry policy.
    pub async fn push_blob(
        &self,
        r: &ImageRef,
        desc: &Descriptor,
        data: &dyn Opener,
        on_bytes: &OnBytes,
    ) -> Result<(), StoreError> {
        let what = format!("upload of blob {} to {}", desc.digest, r.repository);
        // The source failing to open is not the registry's to retry: it ends the upload.
        self.with_retry(&what, || async {
            let stream = match data.open(0).await {
                Ok(s) => s,
                Err(e) => return Ok(Err(e)),
            };
            self.upload_once(r, desc, &what, stream, on_bytes)
                .await
                .map(Ok)
        })
        .await?
    }

    async fn upload_once(
        &self,
        r: &ImageRef,
        desc: &Descriptor,
        what: &str,
        stream: BlobStream,
        on_bytes: &OnBytes,
    ) -> Result<(), RegistryError> {
        let scopes = vec![Scope::repository(&r.repository, &["pull", "push"])];
        let start = Req {
            method: Method::POST,
            host: &r.registry,
            url: format!("{}/blobs/uploads/", repo_path(r)),
            scopes: scopes.clone(),
            headers: vec![(
                reqwest::header::CONTENT_LENGTH,
                HeaderValue::from_static("0"),
            )],
            body: None,
            what,
        };
        let resp = self.transport.send(&start).await?;
        if resp.status() != StatusCode::ACCEPTED {
            return Err(status_error(&r.registry, what, resp).await);
        }
        let mut put_url = super::upload_location(&resp, &r.registry, what)?;
        drop(resp);
        put_url
            .query_pairs_mut()
            .append_pair("digest", desc.digest.as_str());
        // The body can be sent once per attempt (a stream is read once): a second send within
        // the attempt (a 401 answered with a new token) gets an empty body, fails, and the
        // attempt is retried with the stream opened anew.
        let once = Mutex::new(Some(stream));
        let report = on_bytes.clone();
        let make_body = move || -> reqwest::Body {
            let s = once.lock().ok().and_then(|mut s| s.take());
            match s {
                Some(s) => {
                    let report = report.clone();
                    reqwest::Body::wrap_stream(s.inspect(move |c| {
                        if let Ok(c) = c {
                            report(c.len() as u64);
                        }
                    }))
                }
                None => reqwest::Body::from(Vec::new()),
            }
        };
        let put = Req {
            method: Method::PUT,
            host: &r.registry,
            url: put_url.to_string(),
            scopes,
            headers: vec![
                (
                    reqwest::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/octet-stream"),
                ),
                (
                    reqwest::header::CONTENT_LENGTH,
                    HeaderValue::from(desc.size),
                ),
            ],
            body: Some(&make_body),
            what,
        };
        let resp = self.transport.send(&put).await?;
        if resp.status() != StatusCode::CREATED {
            return Err(status_error(&r.registry, what, resp).await);
        }
        Ok(())
    }
}

impl Download {
    /// GET the rest of the blob (a range from `pos`), following redirects.
    async fn open(&mut self) -> Result<(), RegistryError> {
        let mut headers = HeaderMap::new();
        // Always a range (0- too): every byte is hashed once, by the sink.
        if let Ok(v) = HeaderValue::from_str(&format!("bytes={}-{}", self.pos, self.desc.size - 1))
        {
            headers.insert(reqwest::header::RANGE, v);
        }
        let resp = self
            .reg
            .blob_get(
                &self.r,
                &self.desc.digest,
                &self.what,
                &headers,
                &mut self.redirected,
            )
            .await?;
        match resp.status() {
            StatusCode::PARTIAL_CONTENT => {
                let start = resp
                    .headers()
                    .get(reqwest::header::CONTENT_RANGE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("bytes "))
                    .and_then(|v| v.split('-').next())
                    .and_then(|v| v.trim().parse::<u64>().ok());
                if start != Some(self.pos) {
                    return Err(RegistryError::transport(
                        &self.r.registry,
                        &self.what,
                        format!("asked for bytes from {}, got {start:?}", self.pos),
                        String::new(),
                        false,
                    ));
                }
            }
            StatusCode::OK if self.pos == 0 => {}
            // The range was ignored: the whole blob comes again; what is already there is
            // skipped as it arrives.
            StatusCode::OK => self.skip = self.pos,
            _ => {
                let e = status_error(&self.r.registry, &self.what, resp).await;
                // A stale signed CDN URL: go through the registry again.
                self.redirected = None;
                return Err(e);
            }
        }
        self.resp = Some(resp);
        Ok(())
    }
}
