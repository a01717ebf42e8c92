//! Who may hold a connection: a bound on connections in all and per client address. One client
//! holding hundreds of idle sockets cannot keep others out: it reaches its own bound (further
//! sockets are closed at once), and when several together fill the server, a newcomer takes the
//! place of an idle socket (no request in flight) of the client holding the most.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Most connections open at once, by default.
pub const MAX_CONNECTIONS: usize = 1024;
/// Most connections one client address may hold.
pub const MAX_PER_CLIENT: usize = 64;
/// Time a client has to send its request headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// The same once more than half the connections are taken.
pub const HEADER_TIMEOUT_BUSY: Duration = Duration::from_secs(5);
/// An idle connection younger than this is not given up (its client's request may be on the
/// way).
pub const MIN_IDLE: Duration = Duration::from_millis(500);

/// One admitted connection.
#[derive(Debug)]
pub struct Conn {
    id: u64,
    ip: IpAddr,
    in_flight: AtomicUsize,
    idle_since: Mutex<Instant>,
    /// Notified when the connection is to close (evicted).
    pub evict: Notify,
}

impl Conn {
    /// A request started on this connection.
    pub fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
    }
    /// A request's response ended (or was abandoned).
    pub fn request_ended(&self) {
        if let Ok(mut t) = self.idle_since.lock() {
            *t = Instant::now();
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
    fn idle_for(&self, now: Instant) -> Option<Duration> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        self.idle_since
            .lock()
            .ok()
            .map(|t| now.saturating_duration_since(*t))
    }
}

/// What [`Conns::admit`] decided.
#[derive(Debug)]
pub enum Admission {
    /// Serve it, with this header timeout. Drop the guard when the connection ends.
    Admitted(Guard, Duration),
    /// No room (every connection in the way has a request in flight): close it.
    Refused(&'static str),
}

/// Releases a connection's place when dropped.
#[derive(Debug)]
pub struct Guard {
    conns: Arc<Conns>,
    /// The connection.
    pub conn: Arc<Conn>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(mut m) = self.conns.open.lock() {
            m.remove(&self.conn.id);
        }
    }
}

/// The open connections.
#[derive(Debug)]
pub struct Conns {
    open: Mutex<HashMap<u64, Arc<Conn>>>,
    next: AtomicUsize,
    max: usize,
    per_client: usize,
}

impl Conns {
    /// At most `max` connections, `per_client` of them from one address.
    pub fn with_limits(max: usize, per_client: usize) -> Arc<Conns> {
        Arc::new(Conns {
            open: Mutex::new(HashMap::new()),
            next: AtomicUsize::new(0),
            max: max.max(1),
            per_client: per_client.max(1),
        })
    }

    /// Connections open now.
    pub fn len(&self) -> usize {
        self.open.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// True when none is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Admit a new connection from `ip`. A client at its own bound is refused (closing one of
    /// its own idle sockets for it would let one client churn through the others' places). At
    /// the global bound, the longest-idle connection of the client holding the most is closed
    /// for the newcomer, if that client holds more than the newcomer's would; refused when no
    /// such connection is idle.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Admission {
        let now = Instant::now();
        let Ok(mut open) = self.open.lock() else {
            return Admission::Refused("internal lock poisoned");
        };
        let mut per_ip: HashMap<IpAddr, usize> = HashMap::new();
        for c in open.values() {
            *per_ip.entry(c.ip).or_default() += 1;
        }
        let mine = per_ip.get(&ip).copied().unwrap_or(0);
        if mine >= self.per_client {
            return Admission::Refused("too many connections from this client");
        }
        if open.len() >= self.max {
            // Only from a client holding more than this one would after admission (else two
            // clients could churn each other's sockets forever): (its count, idle for), the
            // largest wins.
            let victim = open
                .values()
                .filter_map(|c| {
                    let theirs = per_ip.get(&c.ip).copied().unwrap_or(0);
                    if theirs <= mine + 1 {
                        return None;
                    }
                    let idle = c.idle_for(now).filter(|d| *d >= MIN_IDLE)?;
                    Some(((theirs, idle), c.id))
                })
                .max()
                .map(|(_, id)| id);
            match victim.and_then(|v| open.remove(&v)) {
                Some(v) => v.evict.notify_one(),
                None => return Admission::Refused("too many connections"),
            }
        }
        let id = self.next.fetch_add(1, Ordering::SeqCst) as u64;
        let conn = Arc::new(Conn {
            id,
            ip,
            in_flight: AtomicUsize::new(0),
            idle_since: Mutex::new(now),
            evict: Notify::new(),
        });
        open.insert(id, conn.clone());
        let timeout = if open.len() * 2 > self.max {
            HEADER_TIMEOUT_BUSY
        } else {
            HEADER_TIMEOUT
        };
        drop(open);
        Admission::Admitted(
            Guard {
                conns: self.clone(),
                conn,
            },
            timeout,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn admitted(a: Admission) -> Guard {
        match a {
            Admission::Admitted(g, _) => g,
            Admission::Refused(why) => panic!("refused: {why}"),
        }
    }

    #[test]
    fn one_client_cannot_take_more_than_its_share() {
        let conns = Conns::with_limits(100, 3);
        let attacker = ip("127.0.0.1");
        let held: Vec<Guard> = (0..3).map(|_| admitted(conns.admit(attacker))).collect();
        for g in &held {
            *g.conn.idle_since.lock().unwrap() -= Duration::from_secs(60);
        }
        // Even idle, its own sockets are not traded for its newcomers.
        assert!(matches!(conns.admit(attacker), Admission::Refused(_)));
        assert_eq!(conns.len(), 3);
        // Another client is not limited by this one's bound.
        let other = admitted(conns.admit(ip("127.0.0.2")));
        assert_eq!(conns.len(), 4);
        drop((other, held));
        assert!(conns.is_empty());
    }

    #[test]
    fn at_the_global_bound_the_biggest_holder_gives_up_an_idle_socket() {
        let conns = Conns::with_limits(4, 3);
        let big: Vec<Guard> = (0..3)
            .map(|_| admitted(conns.admit(ip("10.0.0.1"))))
            .collect();
        let small = admitted(conns.admit(ip("10.0.0.2")));
        for g in big.iter().chain([&small]) {
            *g.conn.idle_since.lock().unwrap() -= Duration::from_secs(60);
        }
        // The small holder's socket has been idle longest, but the big holder pays.
        *small.conn.idle_since.lock().unwrap() -= Duration::from_secs(600);
        big[1].conn.request_started();
        let newcomer = admitted(conns.admit(ip("10.0.0.3")));
        let open = conns.open.lock().unwrap();
        assert!(open.contains_key(&small.conn.id));
        assert!(open.contains_key(&big[1].conn.id), "busy: never given up");
        assert_eq!(open.len(), 4);
        drop(open);
        drop((newcomer, big, small));
    }

    #[test]
    fn equal_holders_do_not_churn_each_other() {
        let conns = Conns::with_limits(4, 4);
        let a: Vec<Guard> = (0..2)
            .map(|_| admitted(conns.admit(ip("10.0.0.1"))))
            .collect();
        let b: Vec<Guard> = (0..2)
            .map(|_| admitted(conns.admit(ip("10.0.0.2"))))
            .collect();
        for g in a.iter().chain(&b) {
            *g.conn.idle_since.lock().unwrap() -= Duration::from_secs(60);
        }
        assert!(matches!(conns.admit(ip("10.0.0.1")), Admission::Refused(_)));
        assert!(matches!(conns.admit(ip("10.0.0.2")), Admission::Refused(_)));
        // A client holding nothing gets in.
        let c = admitted(conns.admit(ip("10.0.0.3")));
        drop((a, b, c));
    }

    #[test]
    fn global_bound_and_header_timeout_under_pressure() {
        let conns = Conns::with_limits(4, 4);
        let timeout = |a: Admission| match a {
            Admission::Admitted(g, t) => (g, t),
            Admission::Refused(w) => panic!("{w}"),
        };
        let (a, t) = timeout(conns.admit(ip("10.0.0.1")));
        assert_eq!(t, HEADER_TIMEOUT);
        let (b, t) = timeout(conns.admit(ip("10.0.0.1")));
        assert_eq!(t, HEADER_TIMEOUT);
        let (c, t) = timeout(conns.admit(ip("10.0.0.1")));
        assert_eq!(t, HEADER_TIMEOUT_BUSY, "more than half taken");
        let d = admitted(conns.admit(ip("10.0.0.4")));
        // Full, and every connection has just opened: refused.
        assert!(matches!(conns.admit(ip("10.0.0.5")), Admission::Refused(_)));
        *c.conn.idle_since.lock().unwrap() -= Duration::from_secs(60);
        let e = admitted(conns.admit(ip("10.0.0.5")));
        assert!(!conns.open.lock().unwrap().contains_key(&c.conn.id));
        assert_eq!(conns.len(), 4);
        drop((a, b, c, d, e));
    }
}
