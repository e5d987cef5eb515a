//! The communicator's conformance checks over `MpiComm`, for `scripts/mpi-tests.sh`.
//!
//! ```sh
//! cargo build -p fanout-comm --features mpi --examples
//! mpirun -np 3 target/debug/examples/mpi_check          # every check on every rank
//! mpirun -np 2 target/debug/examples/mpi_check fail     # rank 1 fails, the others are waiting
//! ```
//!
//! `checks` (the default) exits 0 when every check passed on every rank, else 1 with one line
//! per failed check and rank on stderr. Rank 0 prints `mpi_check: N ranks: K checks passed on
//! every rank`. `fail` makes rank 1 call `Comm::fail` while the other ranks wait in a sum: the job
//! must end non-zero with `fanout: rank 1: deliberate failure from mpi_check` on stderr.

use fanout_comm::{conformance, launched_by_mpi, Comm, MpiComm};
use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "checks".into());
    if mode != "checks" && mode != "fail" {
        eprintln!("usage: mpi_check [checks|fail]");
        return ExitCode::from(2);
    }
    let comm = match MpiComm::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mpi_check: {e}");
            return ExitCode::FAILURE;
        }
    };
    if mode == "fail" {
        return fail_mode(&comm);
    }
    checks(&comm)
}

fn checks(comm: &MpiComm) -> ExitCode {
    let (r, n) = (comm.rank(), comm.size());
    let mut results = conformance::run(comm);
    results.push(conformance::CheckResult {
        name: "launched_by_mpi",
        outcome: if launched_by_mpi() {
            Ok(())
        } else {
            Err("launched_by_mpi() is false under mpirun".into())
        },
    });
    let mut failed = 0u32;
    for res in &results {
        if let Err(why) = &res.outcome {
            failed += 1;
            eprintln!("mpi_check: rank {r}: check {} failed: {why}", res.name);
        }
    }
    let all = match comm.all_gather(&failed.to_le_bytes()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("mpi_check: rank {r}: gathering the outcomes failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let total: u32 = all
        .iter()
        .map(|b| b.as_slice().try_into().map_or(1, u32::from_le_bytes))
        .sum();
    if r == 0 {
        if total == 0 {
            println!(
                "mpi_check: {n} ranks (MPI_THREAD_{}): {} checks passed on every rank",
                if comm.thread_multiple() {
                    "MULTIPLE"
                } else {
                    "SERIALIZED"
                },
                results.len()
            );
        } else {
            eprintln!("mpi_check: {n} ranks: {total} check failures (see the lines above)");
        }
    }
    if total == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn fail_mode(comm: &MpiComm) -> ExitCode {
    let r = comm.rank();
    if comm.size() < 2 {
        eprintln!("mpi_check: fail needs at least 2 ranks");
        return ExitCode::from(2);
    }
    if r == 1 {
        // Let the others block in the sum first.
        std::thread::sleep(Duration::from_millis(300));
        comm.fail("deliberate failure from mpi_check");
    }
    let mut buf = vec![1.0f32; 1000];
    let got = comm.all_reduce_sum_f32(&mut buf);
    eprintln!(
        "mpi_check: rank {r}: the sum returned {got:?} after rank 1 failed (expected the job to \
         end)"
    );
    ExitCode::from(3)
}
