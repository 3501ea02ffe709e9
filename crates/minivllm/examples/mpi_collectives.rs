//! The MPI communicator's collectives, checked on every rank:
//! `mpirun -n 3 target/debug/examples/mpi_collectives` (built with `--features mpi`).
//! Each rank exits non-zero on a wrong result, so `mpirun` fails with it.

use minivllm::distributed::mpi::MpiCommunicator;
use minivllm::distributed::Communicator;

fn main() {
    let comm = MpiCommunicator::init().expect("MPI starts");
    let (rank, n) = (comm.rank(), comm.world_size());

    let mut buf: Vec<f32> = (0..1000).map(|i| (rank * 1000 + i) as f32).collect();
    comm.all_reduce_sum(&mut buf).unwrap();
    let want = |i: usize| (0..n).map(|r| (r * 1000 + i) as f32).sum::<f32>();
    assert!(
        buf.iter().enumerate().all(|(i, &x)| x == want(i)),
        "rank {rank}: all-reduce"
    );

    let local = [rank as f32, -(rank as f32)];
    let mut out = vec![0.0; 2 * n];
    comm.all_gather(&local, &mut out).unwrap();
    let expected: Vec<f32> = (0..n).flat_map(|r| [r as f32, -(r as f32)]).collect();
    assert_eq!(out, expected, "rank {rank}: all-gather");

    // Gathered on rank 0 only: the others pass no room for it.
    let mut at_root = vec![0.0; if rank == 0 { 2 * n } else { 0 }];
    comm.gather(0, &local, &mut at_root).unwrap();
    if rank == 0 {
        assert_eq!(at_root, expected, "rank {rank}: gather");
    }

    let root = n - 1;
    let mut bytes = if rank == root {
        b"step metadata".to_vec()
    } else {
        Vec::new()
    };
    comm.broadcast_bytes(root, &mut bytes).unwrap();
    assert_eq!(bytes, b"step metadata", "rank {rank}: broadcast");

    comm.barrier().unwrap();
    println!("rank {rank}/{n}: collectives ok");
    time_all_reduces(&comm);
}

/// What the model's all-reduces cost alone, with every rank ready at once (in a forward
/// pass, time in a collective also includes waiting for the slowest rank): one token's
/// hidden state (SmolLM2's 576 floats, TinyLlama's 2,048) and a 256-token prefill's.
fn time_all_reduces(comm: &MpiCommunicator) {
    for (what, len, iters) in [
        ("1 x 576", 576, 2000),
        ("1 x 2048", 2048, 2000),
        ("256 x 576", 256 * 576, 50),
        ("256 x 2048", 256 * 2048, 20),
    ] {
        let mut buf = vec![1.0f32; len];
        comm.barrier().unwrap();
        let start = std::time::Instant::now();
        for _ in 0..iters {
            comm.all_reduce_sum(&mut buf).unwrap();
        }
        let each = start.elapsed() / iters;
        if comm.rank() == 0 {
            println!(
                "all-reduce of {what} floats over {} ranks: {:.1} us",
                comm.world_size(),
                each.as_secs_f64() * 1e6
            );
        }
    }
}
