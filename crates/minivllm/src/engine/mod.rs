pub mod chat_template;
pub mod detokenizer;
pub mod greedy;
pub mod tokenizer;
