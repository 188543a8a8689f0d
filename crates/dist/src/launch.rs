//! Where a rank is in a run and how the ranks meet.
//!
//! Two ways to start a run, one set of variables (torchrun's names):
//! * one host: `--gpus N` on the command line makes the program start itself N times
//!   ([`spawn_local`]) with `RANK` = `LOCAL_RANK` = 0..N, `WORLD_SIZE` = N and a local
//!   `MASTER_ADDR:MASTER_PORT`;
//! * several hosts: start one process per GPU with those variables set (torchrun, Slurm, or
//!   by hand); `MASTER_ADDR:MASTER_PORT` is where rank 0 listens.
//!
//! Rank 0 creates the NCCL id and serves it to the others over TCP at the master address
//! ([`share_from_rank0`]); that is the only thing exchanged outside NCCL.

use candle_core::{bail, Result};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// One rank's place in a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankEnv {
    pub rank: usize,
    pub world: usize,
    /// The rank's GPU on its host.
    pub local_rank: usize,
    /// `host:port` where rank 0 serves the rendezvous.
    pub master: String,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|s| !s.trim().is_empty())
}

fn parse(name: &str, v: &str) -> Result<usize> {
    v.trim()
        .parse()
        .map_err(|_| candle_core::Error::Msg(format!("{name}={v:?} is not a non-negative integer")))
}

impl RankEnv {
    /// From `RANK`, `WORLD_SIZE`, `LOCAL_RANK` (default: `RANK`), `MASTER_ADDR` (default
    /// 127.0.0.1) and `MASTER_PORT`; `None` when `RANK` is unset (a single-process run).
    pub fn from_env() -> Result<Option<Self>> {
        let Some(rank) = var("RANK") else {
            return Ok(None);
        };
        let rank = parse("RANK", &rank)?;
        let Some(world) = var("WORLD_SIZE") else {
            bail!(
                "RANK is set but WORLD_SIZE is not: set both (and MASTER_PORT) for a parallel run"
            );
        };
        let world = parse("WORLD_SIZE", &world)?;
        if rank >= world {
            bail!("RANK {rank} is not below WORLD_SIZE {world}");
        }
        let local_rank = match var("LOCAL_RANK") {
            Some(v) => parse("LOCAL_RANK", &v)?,
            None => rank,
        };
        let addr = var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
        let Some(port) = var("MASTER_PORT") else {
            bail!("MASTER_PORT is not set: the ranks meet at MASTER_ADDR:MASTER_PORT");
        };
        parse("MASTER_PORT", &port)?;
        Ok(Some(Self {
            rank,
            world,
            local_rank,
            master: format!("{addr}:{}", port.trim()),
        }))
    }
}

/// Rank 0 calls `make` and serves its bytes at the master address to the other ranks, which
/// connect (retrying until `timeout`) and read them; every rank returns the same bytes.
pub fn share_from_rank0(
    env: &RankEnv,
    make: impl FnOnce() -> Result<Vec<u8>>,
    timeout: Duration,
) -> Result<Vec<u8>> {
    let w =
        |e: std::io::Error| candle_core::Error::Msg(format!("rendezvous at {}: {e}", env.master));
    if env.rank == 0 {
        let payload = make()?;
        let listener = TcpListener::bind(&env.master).map_err(w)?;
        for _ in 1..env.world {
            let (mut s, _) = listener.accept().map_err(w)?;
            s.write_all(&(payload.len() as u32).to_le_bytes())
                .map_err(w)?;
            s.write_all(&payload).map_err(w)?;
        }
        return Ok(payload);
    }
    let start = Instant::now();
    let mut s = loop {
        match TcpStream::connect(&env.master) {
            Ok(s) => break s,
            Err(e) if start.elapsed() < timeout => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => bail!(
                "rank {}: rank 0 did not answer at {} within {:?}: {e}",
                env.rank,
                env.master,
                timeout
            ),
        }
    };
    let mut len = [0u8; 4];
    s.read_exact(&mut len).map_err(w)?;
    let mut payload = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut payload).map_err(w)?;
    Ok(payload)
}

/// A free TCP port on this host (for the local master address).
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(candle_core::Error::wrap)?;
    Ok(l.local_addr().map_err(candle_core::Error::wrap)?.port())
}

/// Starts this program `n` times with `args`, as ranks 0..n of one host (`RANK`,
/// `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` set), and waits for all of
/// them: an error names the ranks that failed.
pub fn spawn_local(n: usize, args: &[String]) -> Result<()> {
    let exe = std::env::current_exe().map_err(candle_core::Error::wrap)?;
    let port = free_port()?;
    let mut children = Vec::with_capacity(n);
    for rank in 0..n {
        let child = std::process::Command::new(&exe)
            .args(args)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .spawn()
            .map_err(|e| candle_core::Error::Msg(format!("starting rank {rank}: {e}")))?;
        children.push(child);
    }
    let mut failed = vec![];
    for (rank, mut c) in children.into_iter().enumerate() {
        let ok = c.wait().map(|s| s.success()).unwrap_or(false);
        if !ok {
            failed.push(rank);
        }
    }
    if !failed.is_empty() {
        bail!("ranks {failed:?} of {n} failed (their output above says why)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank 0's bytes reach every other rank, whichever starts first.
    #[test]
    fn rendezvous_hands_rank0_bytes_to_all() {
        let port = free_port().unwrap();
        let world = 4;
        let handles: Vec<_> = (0..world)
            .rev()
            .map(|rank| {
                std::thread::spawn(move || {
                    let env = RankEnv {
                        rank,
                        world,
                        local_rank: rank,
                        master: format!("127.0.0.1:{port}"),
                    };
                    share_from_rank0(&env, || Ok((0..128u8).collect()), Duration::from_secs(20))
                        .unwrap()
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), (0..128u8).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_lone_rank_fails_with_the_address() {
        let env = RankEnv {
            rank: 1,
            world: 2,
            local_rank: 1,
            master: format!("127.0.0.1:{}", free_port().unwrap()),
        };
        let e = share_from_rank0(&env, || Ok(vec![]), Duration::from_millis(200)).unwrap_err();
        assert!(e.to_string().contains("did not answer"), "{e}");
    }
}
