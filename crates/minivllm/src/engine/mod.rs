pub mod chat_template;
pub mod greedy;
pub mod tokenizer;
