//! Network namespaces and ports: work that must happen where the control plane listens.

use std::fs::File;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::Path;

use nix::sched::{CloneFlags, setns};

use crate::{Error, Result};

/// Runs `f` on a fresh thread inside the network namespace `netns` (the calling thread when
/// `None`): sockets `f` opens belong there. A panic in `f` is propagated.
pub fn run_in<T: Send>(netns: Option<&Path>, f: impl FnOnce() -> T + Send) -> Result<T> {
    let Some(netns) = netns else { return Ok(f()) };
    let handle = File::open(netns).map_err(|e| Error::io(format!("opening {}", netns.display()), e))?;
    std::thread::scope(|scope| {
        let thread = scope.spawn(move || -> Result<T> {
            setns(&handle, CloneFlags::CLONE_NEWNET)
                .map_err(|e| Error::io(format!("entering {}", netns.display()), e.into()))?;
            drop(handle);
            Ok(f())
        });
        match thread.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// `count` distinct ports free on `ip` (in `netns`) right now: all bound at once, then released
/// for the servers to take. Another process may take one in between; the kernel hands out
/// ephemeral ports in turn, so parallel tests rarely collide, and a start that does fails loudly.
pub fn free_ports(netns: Option<&Path>, ip: IpAddr, count: usize) -> Result<Vec<u16>> {
    run_in(netns, || -> Result<Vec<u16>> {
        let listeners = (0..count)
            .map(|_| TcpListener::bind(SocketAddr::new(ip, 0)))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| Error::io(format!("binding a free port on {ip}"), e))?;
        listeners
            .iter()
            .map(|l| l.local_addr().map(|a| a.port()))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| Error::io("reading a bound port", e))
    })?
}
