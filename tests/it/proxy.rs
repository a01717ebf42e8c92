//! A TCP proxy on 127.0.0.1 in front of a real registry that "goes down" after a byte budget:
//! every open connection is cut and new ones are closed at once.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub struct Proxy {
    pub addr: String,
    pub down: Arc<AtomicBool>,
}

pub fn start(upstream: &str, budget: u64) -> Proxy {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let down = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::new(Mutex::new(Vec::new()));
    let upstream = upstream.to_string();
    let d = down.clone();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            if d.load(Ordering::SeqCst) {
                let _ = client.shutdown(Shutdown::Both);
                continue;
            }
            let Ok(server) = TcpStream::connect(&upstream) else {
                continue;
            };
            conns
                .lock()
                .unwrap()
                .extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
            let (d1, s1, c1) = (d.clone(), sent.clone(), conns.clone());
            let (mut cr, mut sw) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let mut buf = [0u8; 16384];
                loop {
                    let n = match cr.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if s1.fetch_add(n as u64, Ordering::SeqCst) + n as u64 > budget {
                        d1.store(true, Ordering::SeqCst);
                        for c in c1.lock().unwrap().iter() {
                            let _ = c.shutdown(Shutdown::Both);
                        }
                        break;
                    }
                    if sw.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = sw.shutdown(Shutdown::Write);
            });
            let (mut sr, mut cw) = (server, client);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut sr, &mut cw);
                let _ = cw.shutdown(Shutdown::Write);
            });
        }
    });
    Proxy { addr, down }
}
