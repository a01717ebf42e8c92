//! Bounded LIST: `limit`/`continue` paging with every page typed (`k8s_openapi::List<T>`) and
//! handed on before the next is read, so a list costs one page of memory, never the whole.
//!
//! A server (or something posing as one) decides how many pages there are and what is in them,
//! so every listing is bounded ([`Bounds`]): pages, bytes of one page (capped while read),
//! bytes over all pages, wall-clock time, and a `continue` token seen on any earlier page
//! (issue 17: tokens A, B, A, B... made 1,488 requests in 60 s when only the previous token was
//! compared). Passing a bound ends the listing with an error naming the list and the bound.

use super::client::KubeClient;
use super::ClusterError;
use k8s_openapi::ListableResource;
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// The bounds of one listing.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Objects asked for per page (`limit`).
    pub page_limit: u32,
    /// Pages at most.
    pub max_pages: usize,
    /// Bytes of one page at most (the read stops there).
    pub max_page_bytes: usize,
    /// Bytes over all pages at most.
    pub max_total_bytes: u64,
    /// Wall-clock time for the whole listing.
    pub time: Duration,
}

impl Bounds {
    /// Nodes: 500 a page (as kubectl), 64 MiB a page (500 nodes of a real cluster are 5–15
    /// MiB), 1,000 pages (500,000 nodes, far above the largest clusters), 1 GiB in all, 5 min.
    pub const NODES: Bounds = Bounds::pages_of(500);
    /// Helm release records (Secrets of up to 1 MiB each, etcd's limit): 50 a page.
    pub const SECRETS: Bounds = Bounds::pages_of(50);
    /// DaemonSets: 500 a page.
    pub const DAEMONSETS: Bounds = Bounds::pages_of(500);
    /// Custom resources of a chart CRD (Reservations, NodeSLOs, ...): 500 a page.
    pub const CUSTOM: Bounds = Bounds::pages_of(500);

    /// `page_limit` objects a page; the other bounds those of [`Bounds::NODES`].
    const fn pages_of(page_limit: u32) -> Bounds {
        Bounds {
            page_limit,
            max_pages: 1000,
            max_page_bytes: 64 * 1024 * 1024,
            max_total_bytes: 1024 * 1024 * 1024,
            time: Duration::from_secs(300),
        }
    }
}

/// The paging state: which tokens were seen, how much was read, since when. Pure: it is given
/// each page's token and size, and says whether to go on.
#[derive(Debug)]
pub struct Pager {
    bounds: Bounds,
    seen: HashSet<String>,
    pages: usize,
    bytes: u64,
    start: Instant,
}

impl Pager {
    /// A listing starting now.
    pub fn new(bounds: Bounds) -> Self {
        Pager {
            bounds,
            seen: HashSet::new(),
            pages: 0,
            bytes: 0,
            start: Instant::now(),
        }
    }

    /// Time left for the next page.
    pub fn time_left(&self) -> Duration {
        self.bounds.time.saturating_sub(self.start.elapsed())
    }

    /// A page of `bytes` was read and gave `token`: the token of the next page, `None` when the
    /// list is complete, or why the listing must stop.
    pub fn next(&mut self, token: Option<&str>, bytes: usize) -> Result<Option<String>, String> {
        self.pages += 1;
        self.bytes = self.bytes.saturating_add(bytes as u64);
        let Some(t) = token.filter(|t| !t.is_empty()) else {
            return Ok(None);
        };
        if !self.seen.insert(t.to_string()) {
            return Err(format!(
                "page {} repeats the continue token of an earlier page: the server sends the list round in a circle",
                self.pages
            ));
        }
        if self.pages >= self.bounds.max_pages {
            return Err(format!(
                "more than {} pages of {} objects",
                self.bounds.max_pages, self.bounds.page_limit
            ));
        }
        if self.bytes > self.bounds.max_total_bytes {
            return Err(format!(
                "more than {} bytes over {} pages",
                self.bounds.max_total_bytes, self.pages
            ));
        }
        if self.start.elapsed() >= self.bounds.time {
            return Err(format!(
                "not complete after {} s ({} pages)",
                self.bounds.time.as_secs(),
                self.pages
            ));
        }
        Ok(Some(t.to_string()))
    }
}

/// List `path` (a collection, maybe with a `?labelSelector=...` query) page by page within
/// `bounds`, handing each page's objects to `each`. A 404 is an error (`not_served`): an API
/// server answers a list of what it serves with 200, an empty list included, so a 404 says
/// that something (a proxy, another server) did not answer the question, not that nothing is
/// there; read as "none", it passed a release, a workload's pods or a CRD's objects as absent.
pub async fn list<T, F>(
    client: &KubeClient,
    path: &str,
    bounds: Bounds,
    each: F,
) -> Result<(), ClusterError>
where
    T: ListableResource + serde::de::DeserializeOwned,
    F: FnMut(Vec<T>),
{
    pages::<k8s_openapi::List<T>, F>(client, path, bounds, each).await
}

/// [`list`] for objects without a k8s-openapi type (custom resources), as JSON.
pub async fn list_json<F>(
    client: &KubeClient,
    path: &str,
    bounds: Bounds,
    each: F,
) -> Result<(), ClusterError>
where
    F: FnMut(Vec<serde_json::Value>),
{
    pages::<JsonList, F>(client, path, bounds, each).await
}

/// One page of a list answer: its objects and the token of the next page.
trait Page: serde::de::DeserializeOwned {
    type Item;
    fn split(self) -> (Vec<Self::Item>, Option<String>);
}

impl<T: ListableResource + serde::de::DeserializeOwned> Page for k8s_openapi::List<T> {
    type Item = T;
    fn split(self) -> (Vec<T>, Option<String>) {
        (self.items, self.metadata.continue_)
    }
}

/// A list answer with untyped items (custom resources).
#[derive(serde::Deserialize)]
struct JsonList {
    #[serde(default)]
    metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta,
    #[serde(default)]
    items: Vec<serde_json::Value>,
}

impl Page for JsonList {
    type Item = serde_json::Value;
    fn split(self) -> (Vec<serde_json::Value>, Option<String>) {
        (self.items, self.metadata.continue_)
    }
}

/// The paging loop of [`list`] and [`list_json`]: `limit` and `continue` within `bounds`, each
/// answer checked, a 404 refused ([`not_served`]).
async fn pages<P: Page, F: FnMut(Vec<P::Item>)>(
    client: &KubeClient,
    path: &str,
    bounds: Bounds,
    mut each: F,
) -> Result<(), ClusterError> {
    let mut pager = Pager::new(bounds);
    let mut token: Option<String> = None;
    let sep = if path.contains('?') { '&' } else { '?' };
    loop {
        let mut page_path = format!("{path}{sep}limit={}", bounds.page_limit);
        if let Some(t) = &token {
            page_path.push_str("&continue=");
            page_path.push_str(&koord_base::text::percent_encode(t));
        }
        let stop = |message: String| ClusterError::Api {
            url: client.url(path),
            message: format!("listing stopped: {message}"),
            transient: false,
        };
        let left = pager.time_left();
        let answer = tokio::time::timeout(left, client.fetch(&page_path, bounds.max_page_bytes))
            .await
            .map_err(|_| stop(format!("not complete after {} s", bounds.time.as_secs())))??;
        if answer.status == http::StatusCode::NOT_FOUND {
            return Err(not_served(client, path));
        }
        client.check(&page_path, &answer)?;
        let page: P = client.decode(&page_path, &answer)?;
        let size = answer.body.len();
        drop(answer);
        let (items, next) = page.split();
        each(items);
        match pager.next(next.as_deref(), size).map_err(stop)? {
            Some(t) => token = Some(t),
            None => return Ok(()),
        }
    }
}

/// The error of a list answered 404: the API server does not serve `path`'s collection, so
/// what is there cannot be told.
fn not_served(client: &KubeClient, path: &str) -> ClusterError {
    ClusterError::Api {
        url: client.url(path),
        message: "HTTP 404: the API server does not serve this collection, so koord-bundle cannot tell what is in it (a server that serves it answers 200, an empty list included); check that the kubeconfig's server is the API server itself, not a proxy that answers for it".into(),
        transient: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds() -> Bounds {
        Bounds {
            page_limit: 10,
            max_pages: 5,
            max_page_bytes: 1000,
            max_total_bytes: 2500,
            time: Duration::from_secs(60),
        }
    }

    #[test]
    fn a_token_seen_on_any_earlier_page_stops_the_listing() {
        let mut p = Pager::new(bounds());
        assert_eq!(p.next(Some("A"), 10).unwrap().as_deref(), Some("A"));
        assert_eq!(p.next(Some("B"), 10).unwrap().as_deref(), Some("B"));
        let e = p.next(Some("A"), 10).unwrap_err();
        assert!(e.contains("page 3 repeats the continue token"), "{e}");
        // The last page has no token (or an empty one).
        let mut p = Pager::new(bounds());
        assert_eq!(p.next(Some(""), 10).unwrap(), None);
        assert_eq!(Pager::new(bounds()).next(None, 10).unwrap(), None);
    }

    #[test]
    fn pages_and_bytes_are_bounded() {
        let mut p = Pager::new(bounds());
        for i in 0..4 {
            assert!(p.next(Some(&format!("t{i}")), 10).unwrap().is_some());
        }
        let e = p.next(Some("t5"), 10).unwrap_err();
        assert!(e.contains("more than 5 pages"), "{e}");
        let mut p = Pager::new(bounds());
        assert!(p.next(Some("a"), 1000).unwrap().is_some());
        assert!(p.next(Some("b"), 1000).unwrap().is_some());
        let e = p.next(Some("c"), 1000).unwrap_err();
        assert!(e.contains("more than 2500 bytes over 3 pages"), "{e}");
    }

    #[test]
    fn time_is_bounded() {
        let mut b = bounds();
        b.time = Duration::ZERO;
        let e = Pager::new(b).next(Some("a"), 1).unwrap_err();
        assert!(e.contains("not complete after 0 s"), "{e}");
        // The last page is taken even when the time is up.
        assert_eq!(Pager::new(b).next(None, 1).unwrap(), None);
    }

    /// A list answered 404 is "could not tell", never "none": an API server answers a list of what
    /// it serves with 200, an empty list included (read as none, a 404 passed a release, a
    /// workload's pods or a CRD's objects as absent).
    #[tokio::test]
    async fn a_list_answered_404_is_an_error_not_an_empty_list() {
        use crate::cluster::test_server::{cfg, serve};
        use crate::cluster::{Credentials, KubeClient};
        use k8s_openapi::api::core::v1::Secret as KubeSecret;
        let not_found = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","code":404}"#;
        let (url, _) = serve("404 Not Found", not_found);
        let c = KubeClient::new(&cfg(url, Credentials::None)).unwrap();
        let mut seen = 0;
        let path = "/api/v1/namespaces/x/secrets?labelSelector=owner%3Dhelm";
        let e = list::<KubeSecret, _>(&c, path, Bounds::SECRETS, |p| seen += p.len())
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains("does not serve this collection"),
            "{e}"
        );
        let e = list_json(&c, "/apis/example.com/v1/things", Bounds::CUSTOM, |p| {
            seen += p.len()
        })
        .await
        .unwrap_err();
        assert!(e.to_string().contains("cannot tell what is in it"), "{e}");
        // The same list answered 200 and empty is none.
        let (url, _) = serve(
            "200 OK",
            r#"{"kind":"SecretList","apiVersion":"v1","metadata":{},"items":[]}"#,
        );
        let c = KubeClient::new(&cfg(url, Credentials::None)).unwrap();
        list::<KubeSecret, _>(&c, path, Bounds::SECRETS, |p| seen += p.len())
            .await
            .unwrap();
        assert_eq!(seen, 0);
    }
}
