//! Where each task's web port lives: `<port>-<task>.<apps domain>`, an origin of its own.

use crate::config::Settings;

/// The apps domain, as the operator set it (or as it defaults on this machine).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppsOrigin {
    scheme: String,
    domain: String,
    port: Option<u16>,
}

/// One task's declared port, as its host names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppHost {
    pub task_id: String,
    pub port: u16,
}

/// Longest task id a host label may carry (a DNS label is at most 63 bytes).
const MAX_TASK_ID: usize = 57;

impl AppsOrigin {
    /// `apps_url` when set; else `apps.localhost` on the server's own port while the server is
    /// reached on this machine; else none (no "Open" links).
    pub fn from_settings(settings: &Settings) -> Result<Option<AppsOrigin>, String> {
        if let Some(url) = settings
            .apps_url
            .as_deref()
            .filter(|u| !u.trim().is_empty())
        {
            return AppsOrigin::parse(url).map(Some);
        }
        let public = reqwest::Url::parse(&settings.public_url()).map_err(|e| e.to_string())?;
        let local = match public.host() {
            Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
            Some(url::Host::Ipv4(a)) => a.is_loopback(),
            Some(url::Host::Ipv6(a)) => a.is_loopback(),
            None => false,
        };
        Ok(local.then(|| AppsOrigin {
            scheme: public.scheme().to_owned(),
            domain: "apps.localhost".into(),
            port: public
                .port_or_known_default()
                .filter(|p| !is_default(public.scheme(), *p)),
        }))
    }

    pub fn parse(url: &str) -> Result<AppsOrigin, String> {
        let u = reqwest::Url::parse(url.trim())
            .map_err(|e| format!("apps_url {url:?} is not a URL: {e}"))?;
        if !matches!(u.scheme(), "http" | "https") {
            return Err(format!("apps_url {url:?} must be http:// or https://"));
        }
        let Some(url::Host::Domain(domain)) = u.host() else {
            return Err(format!(
                "apps_url {url:?} must name a domain whose subdomains reach this server"
            ));
        };
        if u.path() != "/" || u.query().is_some() {
            return Err(format!(
                "apps_url {url:?} is an origin only (no path): apps live at its subdomains"
            ));
        }
        Ok(AppsOrigin {
            scheme: u.scheme().to_owned(),
            domain: domain.to_ascii_lowercase(),
            port: u.port(),
        })
    }

    pub fn secure(&self) -> bool {
        self.scheme == "https"
    }

    /// The origin of `app`, e.g. `http://8888-0193….apps.localhost:8080`.
    pub fn url_of(&self, app: &AppHost) -> String {
        let port = self.port.map(|p| format!(":{p}")).unwrap_or_default();
        format!(
            "{}://{}-{}.{}{port}",
            self.scheme, app.port, app.task_id, self.domain
        )
    }

    /// Whether `host` is the apps domain or under it: nothing of the platform's is served
    /// there (a page of the platform on the apps site would share a site with every app).
    pub fn covers(&self, host: &str) -> bool {
        let name = name_of(host);
        name == self.domain
            || name
                .strip_suffix(&self.domain)
                .is_some_and(|rest| rest.ends_with('.'))
    }

    /// The app a request's `Host` names, if it is one of ours.
    pub fn app_of(&self, host: &str) -> Option<AppHost> {
        let name = name_of(host);
        let label = name.strip_suffix(&self.domain)?.strip_suffix('.')?;
        let (port, task_id) = label.split_once('-')?;
        let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
        let valid = !task_id.is_empty()
            && task_id.len() <= MAX_TASK_ID
            && task_id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
        valid.then(|| AppHost {
            task_id: task_id.to_owned(),
            port,
        })
    }
}

/// A `Host` header's name, lower-case, without its port and without the root's trailing dot
/// (`apps.localhost.` is the same name as `apps.localhost`: DNS and browsers take both).
fn name_of(host: &str) -> String {
    let host = host.trim().to_ascii_lowercase();
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name.to_owned(),
        _ => host,
    };
    name.strip_suffix('.').map(str::to_owned).unwrap_or(name)
}

fn is_default(scheme: &str, port: u16) -> bool {
    (scheme == "http" && port == 80) || (scheme == "https" && port == 443)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TASK: &str = "0193a2b4-5c6d-7e8f-9a0b-1c2d3e4f5a6b";

    #[test]
    fn hosts_round_trip() {
        let o = AppsOrigin::parse("https://apps.example.net").unwrap();
        let app = AppHost {
            task_id: TASK.into(),
            port: 8888,
        };
        let url = o.url_of(&app);
        assert_eq!(url, format!("https://8888-{TASK}.apps.example.net"));
        let host = url.strip_prefix("https://").unwrap();
        assert_eq!(o.app_of(host), Some(app.clone()));
        assert_eq!(o.app_of(&host.to_uppercase()), Some(app.clone()));
        assert_eq!(o.app_of(&format!("{host}:443")), Some(app));
    }

    #[test]
    fn other_hosts_are_not_apps() {
        let o = AppsOrigin::parse("http://apps.localhost:8080").unwrap();
        for host in [
            "localhost:8080",
            "apps.localhost:8080",
            "x.apps.localhost",
            &format!("0-{TASK}.apps.localhost"),
            &format!("8888-{TASK}.evil.localhost"),
            &format!("8888-{TASK}xapps.localhost"),
            &format!("8888-{TASK}/x.apps.localhost"),
            "8888-.apps.localhost",
            &format!("99999-{TASK}.apps.localhost"),
            &format!("8888-{}.apps.localhost", "a".repeat(60)),
        ] {
            assert_eq!(o.app_of(host), None, "{host}");
        }
        assert!(o.covers("apps.localhost:8080") && o.covers("x.apps.localhost"));
        assert!(!o.covers("localhost:8080") && !o.covers("evilapps.localhost"));
        // The name with the root's dot is the same name: still the apps site.
        for host in [
            "evil.apps.localhost.:8080",
            "apps.localhost.",
            "X.APPS.LOCALHOST.",
        ] {
            assert!(o.covers(host), "{host}");
        }
        assert_eq!(
            o.app_of(&format!("8888-{TASK}.apps.localhost.:8080")),
            Some(AppHost {
                task_id: TASK.into(),
                port: 8888
            })
        );
    }

    #[test]
    fn bad_apps_urls_are_refused() {
        for bad in [
            "apps.example.net",
            "ftp://apps.example.net",
            "http://10.0.0.1",
            "http://apps.example.net/sub",
        ] {
            assert!(AppsOrigin::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_local_server_gets_local_apps() {
        let s = Settings {
            public_url: Some("http://127.0.0.1:8080".into()),
            ..Settings::default()
        };
        let o = AppsOrigin::from_settings(&s).unwrap().unwrap();
        assert_eq!(o, AppsOrigin::parse("http://apps.localhost:8080").unwrap());
        let s = Settings {
            public_url: Some("https://autodl.example.com".into()),
            ..Settings::default()
        };
        assert_eq!(AppsOrigin::from_settings(&s).unwrap(), None);
    }
}
