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
}
