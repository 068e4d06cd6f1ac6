//! The README's complete provider is examples/hello.rs verbatim.

#[test]
fn readme_example_is_examples_hello() {
    let readme = include_str!("../README.md");
    let example = include_str!("../examples/hello.rs");
    let start = readme.find("```rust\n").map(|i| i + "```rust\n".len());
    let block = start.and_then(|s| readme[s..].find("```\n").map(|e| &readme[s..s + e]));
    assert_eq!(
        block,
        Some(example),
        "copy examples/hello.rs into README.md"
    );
}
