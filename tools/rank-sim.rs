//! `preflight-rank-sim`: a test and benchmark tool (see
//! `src/commands/rank_sim.rs`), built only with the `rank-sim` feature.

fn main() {
    std::process::exit(preflight::rank_sim_main());
}
