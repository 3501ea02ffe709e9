use minivllm::config::ModelConfig;
use minivllm::model_executor::input_metadata::InputMetadata;
use minivllm::model_executor::loader::{read_json, safetensors::SafetensorsWeights};
use minivllm::model_executor::models::llama::LlamaForCausalLM;
use minivllm::worker::{cache_engine::CacheEngine, model_runner::ModelRunner};
use minivllm_kernels::softmax::log_softmax_inplace;
fn main() {
    minivllm_kernels::threading::init_threads(2);
    let dir = std::path::Path::new("/tmp/hfdev");
    let config = ModelConfig::from_hf_json(&read_json(&dir.join("config.json")).unwrap()).unwrap();
    let t = std::time::Instant::now();
    let model = LlamaForCausalLM::load(&config, &SafetensorsWeights::open_dir(dir).unwrap()).unwrap();
    eprintln!("load {:?}", t.elapsed());
    let mut runner = ModelRunner::new(model, CacheEngine::new(&config, 16, 64));
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string("/work/shared/reference/smollm2_greedy_hf.json").unwrap()).unwrap();
    for r in json["results"].as_array().unwrap() {
        let ids = |v: &serde_json::Value| v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect::<Vec<_>>();
        let p = ids(&r["prompt_ids"]); let o = ids(&r["output_ids"]);
        let toks: Vec<u32> = p.iter().chain(&o).copied().collect();
        let mut input = InputMetadata::default();
        let blocks: Vec<u32> = (0..toks.len().div_ceil(16) as u32).collect();
        input.add_sequence(&toks, toks.len(), &blocks, 16, false);
        input.logits_indices.extend(p.len()-1..toks.len()-1);
        let t = std::time::Instant::now();
        let logits = runner.execute(&input).unwrap().to_vec();
        let el = t.elapsed();
        let mut worst = 0f32;
        for (s, row) in r["steps"].as_array().unwrap().iter().zip(logits.chunks_exact(49152)) {
            let mut lp = row.to_vec(); log_softmax_inplace(&mut lp);
            for t in s["top5"].as_array().unwrap() { let id = t["id"].as_u64().unwrap() as usize; worst = worst.max((lp[id] - t["logprob"].as_f64().unwrap() as f32).abs()); }
        }
        println!("{} tokens {} forward {:?} worst {:e}", r["kind"], toks.len(), el, worst);
    }
}
