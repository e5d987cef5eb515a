//! STUB (replaced by the real crate on merge).
use std::sync::{Arc, Condvar, Mutex};
pub type Result<T> = std::result::Result<T, CommError>;
#[derive(Debug, Clone, PartialEq)]
pub enum CommError {
    PeerFailed { rank: usize, message: String },
    Invalid(String),
    Mpi(String),
}
impl std::fmt::Display for CommError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CommError::PeerFailed { rank, message } => write!(f, "rank {rank} failed: {message}"),
            CommError::Invalid(m) | CommError::Mpi(m) => f.write_str(m),
        }
    }
}
impl std::error::Error for CommError {}
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct CommStats {
    pub calls: u64,
    pub bytes_sent: u64,
    pub seconds: f64,
}
pub trait Comm: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    fn kind(&self) -> &'static str;
    fn barrier(&self) -> Result<()>;
    fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> Result<()>;
    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()>;
    fn broadcast(&self, root: usize, buf: &mut Vec<u8>) -> Result<()>;
    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;
    fn all_to_all_v(&self, send: &[Vec<u8>]) -> Result<Vec<Vec<u8>>>;
    fn all_to_all_v_f32(&self, send: &[Vec<f32>]) -> Result<Vec<Vec<f32>>>;
    fn send(&self, to: usize, tag: u32, data: &[u8]) -> Result<()>;
    fn recv(&self, from: usize, tag: u32) -> Result<Vec<u8>>;
    fn fail(&self, message: &str);
    fn stats(&self) -> CommStats;
}
pub fn launched_by_mpi() -> bool {
    std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some()
}
struct St {
    gen: u64,
    slots: Vec<Option<Vec<u8>>>,
    done: Option<Arc<Vec<Vec<u8>>>>,
    failed: Option<(usize, String)>,
    arrived: usize,
}
pub struct LocalComm {
    rank: usize,
    size: usize,
    sh: Arc<(Mutex<St>, Condvar)>,
}
impl LocalComm {
    pub fn group(n: usize) -> Vec<LocalComm> {
        let sh = Arc::new((
            Mutex::new(St {
                gen: 0,
                slots: vec![None; n],
                done: None,
                failed: None,
                arrived: 0,
            }),
            Condvar::new(),
        ));
        (0..n)
            .map(|rank| LocalComm {
                rank,
                size: n,
                sh: sh.clone(),
            })
            .collect()
    }
    fn gather(&self, mine: Vec<u8>) -> Result<Arc<Vec<Vec<u8>>>> {
        let (m, cv) = &*self.sh;
        let mut st = m.lock().unwrap();
        if let Some((r, msg)) = &st.failed {
            return Err(CommError::PeerFailed {
                rank: *r,
                message: msg.clone(),
            });
        }
        // wait until previous round fully consumed
        while st.done.is_some() && st.arrived > 0 {
            st = cv.wait(st).unwrap();
            if let Some((r, msg)) = &st.failed {
                return Err(CommError::PeerFailed {
                    rank: *r,
                    message: msg.clone(),
                });
            }
        }
        let gen = st.gen;
        st.slots[self.rank] = Some(mine);
        if st.slots.iter().all(|s| s.is_some()) {
            let all: Vec<Vec<u8>> = st.slots.iter_mut().map(|s| s.take().unwrap()).collect();
            st.done = Some(Arc::new(all));
            st.gen += 1;
            st.arrived = self.size - 1;
            cv.notify_all();
            let d = st.done.clone().unwrap();
            if st.arrived == 0 {
                st.done = None;
            }
            return Ok(d);
        }
        while st.gen == gen {
            st = cv.wait(st).unwrap();
            if let Some((r, msg)) = &st.failed {
                return Err(CommError::PeerFailed {
                    rank: *r,
                    message: msg.clone(),
                });
            }
        }
        let d = st.done.clone().unwrap();
        st.arrived -= 1;
        if st.arrived == 0 {
            st.done = None;
            cv.notify_all();
        }
        Ok(d)
    }
}
fn f32b(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
impl Comm for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn kind(&self) -> &'static str {
        "local"
    }
    fn barrier(&self) -> Result<()> {
        self.gather(vec![]).map(|_| ())
    }
    fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> Result<()> {
        if self.size == 1 {
            return Ok(());
        }
        let all = self.gather(f32b(buf))?;
        for (i, x) in buf.iter_mut().enumerate() {
            let mut s = 0f32;
            for r in all.iter() {
                s += f32::from_le_bytes(r[4 * i..4 * i + 4].try_into().unwrap());
            }
            *x = s;
        }
        Ok(())
    }
    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()> {
        if self.size == 1 {
            return Ok(());
        }
        let all = self.gather(buf.iter().flat_map(|x| x.to_le_bytes()).collect())?;
        for (i, x) in buf.iter_mut().enumerate() {
            let mut s = 0f64;
            for r in all.iter() {
                s += f64::from_le_bytes(r[8 * i..8 * i + 8].try_into().unwrap());
            }
            *x = s;
        }
        Ok(())
    }
    fn broadcast(&self, root: usize, buf: &mut Vec<u8>) -> Result<()> {
        let all = self.gather(buf.clone())?;
        *buf = all[root].clone();
        Ok(())
    }
    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        if self.size == 1 {
            return Ok(vec![mine.to_vec()]);
        }
        Ok((*self.gather(mine.to_vec())?).clone())
    }
    fn all_to_all_v(&self, _send: &[Vec<u8>]) -> Result<Vec<Vec<u8>>> {
        unimplemented!()
    }
    fn all_to_all_v_f32(&self, _send: &[Vec<f32>]) -> Result<Vec<Vec<f32>>> {
        unimplemented!()
    }
    fn send(&self, _to: usize, _tag: u32, _data: &[u8]) -> Result<()> {
        unimplemented!()
    }
    fn recv(&self, _from: usize, _tag: u32) -> Result<Vec<u8>> {
        unimplemented!()
    }
    fn fail(&self, message: &str) {
        let (m, cv) = &*self.sh;
        let mut st = m.lock().unwrap();
        if st.failed.is_none() {
            st.failed = Some((self.rank, message.to_string()));
        }
        cv.notify_all();
    }
    fn stats(&self) -> CommStats {
        CommStats::default()
    }
}
