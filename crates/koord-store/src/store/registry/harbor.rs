//! Harbor, before any push: every repository lives in a project (its first path component),
//! a push never creates one (harbor#20544), and a push into a project that does not exist, or
//! that the user may not push to, gets the same `401 unauthorized: authentication required` as a
//! wrong password (harbor#966, #890); a one-component repository gets 500s that clients retry for
//! ever. So, for the repositories a load will push:
//!
//! 1. each must have a project part;
//! 2. each project must exist: `HEAD /api/v2.0/projects?project_name=P` with the user's login
//!    (200 or 404), or be created (`POST /api/v2.0/projects`, private) when the caller asks;
//! 3. the user must be allowed to push there. How that is told: a token for `pull,push` on
//!    every repository, from Harbor's own token service with the user's credentials (exactly
//!    what the push will get), whose `access` claims say what was granted. The signature is not
//!    checked: the question is what the service granted, not whether to trust the token. This
//!    works for users and robot accounts alike, which Harbor's permission API does not (it
//!    answers for users, `GET /api/v2.0/users/current/permissions`).

use super::auth::Scope;
use super::body::read_capped;
use super::client::{classify_send_error, status_error};
use super::{Registry, RegistryError};
use crate::store::auth::{Credential, Found};
use base64::Engine as _;
use reqwest::{Method, StatusCode};
use std::collections::BTreeMap;

/// Largest API answer read for its message.
const MAX_API_BODY: usize = 64 * 1024;

/// What a load may do with one Harbor project.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ProjectState {
    /// It exists and the login may push there.
    Exists,
    /// It was missing and has just been created (private).
    Created,
    /// It is missing and a real run would create it (a dry run creates nothing).
    WouldCreate,
}

/// One project a load pushes into.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Project {
    /// The project name.
    pub name: String,
    /// Its state.
    pub state: ProjectState,
    /// Harbor's token service grants the login push on every repository of it (a project a
    /// dry run would create counts as yes: its creator administers it).
    pub may_push: bool,
    /// Why not, when not.
    #[serde(skip)]
    pub denied: Option<PushDenied>,
}

/// What Harbor granted where push was asked for.
#[derive(Debug, Clone)]
pub struct PushDenied {
    /// `user "name"`.
    pub who: String,
    /// A repository of the project that was asked for.
    pub repository: String,
    /// What was granted (`[pull]`, `nothing`).
    pub granted: String,
    /// Why the project's existence is unknown, if it is.
    pub unknown: String,
}

impl Project {
    /// The error a push into this project would meet ([`HarborError::NoPush`]), if any. The
    /// caller decides when it matters: a load that finds every tag in place pushes nothing.
    pub fn push_error(&self, host: &str) -> Option<HarborError> {
        self.denied.as_ref().map(|d| HarborError::NoPush {
            host: host.to_string(),
            project: self.name.clone(),
            denied: Box::new(d.clone()),
        })
    }
}

/// What to do about missing projects.
#[derive(Debug, Clone, Copy, Default)]
pub struct CheckOptions {
    /// Create missing projects (`--create-project`).
    pub create: bool,
    /// Create nothing; say what would be created.
    pub dry_run: bool,
}

/// Why a push into Harbor would fail. Every message names the Harbor host, the project and
/// what to do; nothing has been pushed when one is returned.
#[derive(Debug, thiserror::Error)]
pub enum HarborError {
    /// A repository without a project part (`HOST/name`).
    #[error("Harbor at {host} keeps every repository in a project, its first path component, and {} has none (Harbor answers a push there with 500s that clients retry for ever): give a project as the prefix, --registry {host}/PROJECT; nothing was pushed", repositories.join(", "))]
    NoProjectPart {
        /// The Harbor host.
        host: String,
        /// The repositories concerned.
        repositories: Vec<String>,
    },
    /// Projects that do not exist.
    #[error("Harbor at {host} has no project{} {} (koord-bundle pushes to {}; Harbor never creates a project on push and would answer \"401 unauthorized: authentication required\"): create {} in Harbor's web UI (Projects, New Project), pass --create-project to have koord-bundle create {} (private) through Harbor's API, or name an existing project with --registry {host}/PROJECT; nothing was pushed", plural(projects), projects.join(", "), examples.join(", "), them(projects), them(projects))]
    ProjectMissing {
        /// The Harbor host.
        host: String,
        /// The missing projects.
        projects: Vec<String>,
        /// One repository pushed into each (`site1/koordinator-sh/koordlet`).
        examples: Vec<String>,
    },
    /// Harbor refused to create a project.
    #[error("Harbor at {host} refused to create project {project} for {who} ({answer}): robot accounts may not create projects, and neither may users where creation is restricted to administrators; ask a Harbor administrator to create {project}, then re-run; nothing was pushed")]
    CreateRefused {
        /// The Harbor host.
        host: String,
        /// The project.
        project: String,
        /// `user "name"`.
        who: String,
        /// Harbor's answer.
        answer: String,
    },
    /// The login may not push into a project.
    #[error("{} may not push to Harbor project {project} on {host}: its token service granted {} for {}, not push{}; ask a project admin of {project} to make {} a Developer, Maintainer or Project Admin there (a robot account needs the push permission on {project}), or log in as another account; nothing was pushed", denied.who, denied.granted, denied.repository, denied.unknown, denied.who)]
    NoPush {
        /// The Harbor host.
        host: String,
        /// The project.
        project: String,
        /// Who, and what was granted instead.
        denied: Box<PushDenied>,
    },
    /// An answer of Harbor's API that is none of the above.
    #[error("Harbor at {host} answered {what}: {message}")]
    Api {
        /// The Harbor host.
        host: String,
        /// The request.
        what: String,
        /// The answer.
        message: String,
    },
    /// No login, refused login, unreachable...
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

impl koord_base::exit::Classify for HarborError {
    fn exit_class(&self) -> Option<koord_base::exit::ExitClass> {
        match self {
            HarborError::Registry(r) => r.exit_class(),
            // No project, no right to create or push to it, Harbor refusing: the user's to
            // arrange with Harbor's administrators.
            _ => Some(koord_base::exit::ExitClass::Input),
        }
    }
}

fn plural(v: &[String]) -> &'static str {
    if v.len() == 1 {
        ""
    } else {
        "s"
    }
}

fn them(v: &[String]) -> &'static str {
    if v.len() == 1 {
        "it"
    } else {
        "them"
    }
}

/// Does a project exist, as far as the API says?
enum Exists {
    Yes,
    No,
    /// The API would not say (why).
    Unknown(String),
}

impl Registry {
    /// Check, before any push, that `repositories` (full paths on `host`) can be pushed into
    /// Harbor: each in a project that exists (or is created, with `opts.create`), and whether the
    /// login may push there (see [`Project::push_error`]). Returns the projects, sorted.
    pub async fn harbor_check(
        &self,
        host: &str,
        repositories: &[String],
        opts: CheckOptions,
    ) -> Result<Vec<Project>, HarborError> {
        let lone: Vec<String> = repositories
            .iter()
            .filter(|r| !r.contains('/'))
            .cloned()
            .collect();
        if !lone.is_empty() {
            return Err(HarborError::NoProjectPart {
                host: host.to_string(),
                repositories: lone,
            });
        }
        let mut by_project: BTreeMap<&str, Vec<&String>> = BTreeMap::new();
        for r in repositories {
            let project = r.split('/').next().unwrap_or(r);
            by_project.entry(project).or_default().push(r);
        }
        let what = format!(
            "a push into Harbor project {}",
            by_project.keys().copied().collect::<Vec<_>>().join(", ")
        );
        let found = self.login_for(host, &what).await?;
        let mut unknown: BTreeMap<&str, String> = BTreeMap::new();
        let mut missing: Vec<&str> = Vec::new();
        for project in by_project.keys() {
            match self.project_exists(host, project, &found).await? {
                Exists::Yes => {}
                Exists::No => missing.push(project),
                Exists::Unknown(why) => {
                    unknown.insert(project, why);
                }
            }
        }
        if !missing.is_empty() && !opts.create {
            return Err(HarborError::ProjectMissing {
                host: host.to_string(),
                projects: missing.iter().map(|p| p.to_string()).collect(),
                examples: missing
                    .iter()
                    .filter_map(|p| by_project.get(p).and_then(|v| v.first()))
                    .map(|r| r.to_string())
                    .collect(),
            });
        }
        let mut states: BTreeMap<&str, ProjectState> = by_project
            .keys()
            .map(|p| (*p, ProjectState::Exists))
            .collect();
        for project in &missing {
            let state = if opts.dry_run {
                ProjectState::WouldCreate
            } else {
                self.create_project(host, project, &found).await?
            };
            states.insert(project, state);
        }
        // What a push would be granted, for every repository of a project that is there now.
        let asked: Vec<&String> = by_project
            .iter()
            .filter(|(p, _)| states.get(*p) != Some(&ProjectState::WouldCreate))
            .flat_map(|(_, rs)| rs.iter().copied())
            .collect();
        let mut denied: BTreeMap<&str, PushDenied> = BTreeMap::new();
        if let Some(granted) = self.granted(host, &asked, &what).await? {
            for r in asked {
                let acts = granted.get(r.as_str()).cloned().unwrap_or_default();
                let project = r.split('/').next().unwrap_or(r);
                if acts.iter().any(|a| a == "push" || a == "*") || denied.contains_key(project) {
                    continue;
                }
                denied.insert(project, PushDenied {
                    who: found.credential.who(),
                    repository: r.clone(),
                    granted: if acts.is_empty() {
                        "nothing".into()
                    } else {
                        format!("[{}]", acts.join(","))
                    },
                    unknown: unknown
                        .get(project)
                        .map(|why| format!(" (whether project {project} exists, Harbor's API did not say: {why}; if it does not, create it)"))
                        .unwrap_or_default(),
                });
            }
        }
        Ok(states
            .into_iter()
            .map(|(name, state)| {
                let denied = denied.remove(name);
                Project {
                    name: name.to_string(),
                    state,
                    may_push: denied.is_none(),
                    denied,
                }
            })
            .collect())
    }

    /// The login for `host`: Harbor needs one to push, so none is an error (as the push's own).
    async fn login_for(&self, host: &str, what: &str) -> Result<Found, RegistryError> {
        let lookup = self.opts.credentials.resolve(host).await?;
        match lookup.found {
            Some(f) => Ok(f),
            None => Err(RegistryError::NoCredentials {
                registry: host.to_string(),
                what: what.to_string(),
                searched: lookup.searched_text(),
            }),
        }
    }

    /// One request to Harbor's API with the login as HTTP basic auth (an identity token
    /// cannot be sent there: `None`), retried as every request is.
    async fn harbor_api(
        &self,
        host: &str,
        method: Method,
        path_and_query: &str,
        body: Option<&serde_json::Value>,
        found: &Found,
        what: &str,
    ) -> Result<Option<(StatusCode, String)>, RegistryError> {
        let Credential::Basic(login) = &found.credential else {
            return Ok(None);
        };
        let url = format!("{}{path_and_query}", self.transport.base(host));
        self.with_retry(what, || async {
            let mut b = self
                .transport
                .http()
                .request(method.clone(), &url)
                .basic_auth(&login.username, Some(login.password.expose()))
                .header(reqwest::header::ACCEPT, "application/json");
            if let Some(v) = body {
                b = b
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(v.to_string());
            }
            let resp = b
                .send()
                .await
                .map_err(|e| classify_send_error(host, what, &e))?;
            let status = resp.status();
            if super::is_transient_status(status) {
                return Err(status_error(host, what, resp).await);
            }
            let text = read_capped(resp, MAX_API_BODY).await.unwrap_or_default();
            Ok(Some((status, api_message(status, &text))))
        })
        .await
    }

    async fn project_exists(
        &self,
        host: &str,
        project: &str,
        found: &Found,
    ) -> Result<Exists, RegistryError> {
        let query = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("project_name", project)
            .finish();
        let what = format!("HEAD /api/v2.0/projects?{query}");
        let path = format!("/api/v2.0/projects?{query}");
        let answer = self
            .harbor_api(host, Method::HEAD, &path, None, found, &what)
            .await?;
        Ok(match answer {
            None => Exists::Unknown("an identity token cannot log in to Harbor's API".into()),
            Some((StatusCode::OK, _)) => Exists::Yes,
            Some((StatusCode::NOT_FOUND, _)) => Exists::No,
            Some((s, m)) => Exists::Unknown(format!(
                "{what} answered {}",
                if m.is_empty() { s.to_string() } else { m }
            )),
        })
    }

    async fn create_project(
        &self,
        host: &str,
        project: &str,
        found: &Found,
    ) -> Result<ProjectState, HarborError> {
        let what = format!("POST /api/v2.0/projects (create project {project})");
        let body = serde_json::json!({"project_name": project, "metadata": {"public": "false"}});
        let answer = self
            .harbor_api(
                host,
                Method::POST,
                "/api/v2.0/projects",
                Some(&body),
                found,
                &what,
            )
            .await?;
        match answer {
            Some((StatusCode::CREATED, _)) => Ok(ProjectState::Created),
            // Created meanwhile, by someone else.
            Some((StatusCode::CONFLICT, _)) => Ok(ProjectState::Exists),
            Some((s @ (StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN), m)) => {
                Err(HarborError::CreateRefused {
                    host: host.to_string(),
                    project: project.to_string(),
                    who: found.credential.who(),
                    answer: if m.is_empty() { s.to_string() } else { m },
                })
            }
            Some((s, m)) => Err(HarborError::Api {
                host: host.to_string(),
                what,
                message: if m.is_empty() { s.to_string() } else { m },
            }),
            None => Err(HarborError::CreateRefused {
                host: host.to_string(),
                project: project.to_string(),
                who: found.credential.who(),
                answer: "an identity token cannot log in to Harbor's API: log in with a user name and password".into(),
            }),
        }
    }

    /// The actions Harbor's token service grants the login on each repository when asked for
    /// `pull,push` on all of them (`None`: the host does not use token auth, or its token is
    /// not a JWT whose claims can be read).
    async fn granted(
        &self,
        host: &str,
        repositories: &[&String],
        what: &str,
    ) -> Result<Option<BTreeMap<String, Vec<String>>>, RegistryError> {
        if repositories.is_empty() {
            return Ok(None);
        }
        let scopes: Vec<Scope> = repositories
            .iter()
            .map(|r| Scope::repository(r, &["pull", "push"]))
            .collect();
        let Some(token) = self.transport.token_for(host, &scopes, what).await? else {
            return Ok(None);
        };
        Ok(jwt_access(token.expose()))
    }
}

/// `HTTP 404 Not Found: NOT_FOUND: project x not found`: Harbor's API answers errors in the
/// distribution error body (`{"errors": [{"code", "message"}]}`), read as the registry's are.
fn api_message(status: StatusCode, body: &[u8]) -> String {
    super::client::error_text(status, body)
}

/// The `access` claims of a JWT (`repository` name → actions), unverified; `None` when the
/// token is not a JWT with such claims.
fn jwt_access(token: &str) -> Option<BTreeMap<String, Vec<String>>> {
    #[derive(serde::Deserialize)]
    struct Claims {
        #[serde(default)]
        access: Vec<Access>,
    }
    #[derive(serde::Deserialize)]
    struct Access {
        #[serde(rename = "type")]
        kind: String,
        name: String,
        #[serde(default)]
        actions: Vec<String>,
    }
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: Claims = serde_json::from_slice(&bytes).ok()?;
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for a in claims.access.into_iter().filter(|a| a.kind == "repository") {
        out.entry(a.name).or_default().extend(a.actions);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: &str) -> String {
        let e = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!("{}.{}.c2ln", e(r#"{"alg":"RS256"}"#), e(claims))
    }

    #[test]
    fn reads_what_a_token_grants() {
        let t = jwt(
            r#"{"sub":"robot$koord+ci","access":[{"type":"repository","name":"koord/a","actions":["pull","push"]},{"type":"repository","name":"koord/b","actions":[]},{"type":"registry","name":"catalog","actions":["*"]}]}"#,
        );
        let g = jwt_access(&t).unwrap();
        assert_eq!(g["koord/a"], ["pull", "push"]);
        assert!(g["koord/b"].is_empty());
        assert!(!g.contains_key("catalog"));
        assert!(jwt_access("opaque-token").is_none());
        assert!(jwt_access("a.!!!.c").is_none());
    }

    #[test]
    fn harbor_error_bodies() {
        assert_eq!(
            api_message(
                StatusCode::FORBIDDEN,
                br#"{"errors":[{"code":"FORBIDDEN","message":"forbidden"}]}"#
            ),
            "HTTP 403 Forbidden: FORBIDDEN: forbidden"
        );
        assert_eq!(api_message(StatusCode::CONFLICT, b""), "HTTP 409 Conflict");
    }
}
