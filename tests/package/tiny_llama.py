"""The tiny Llama config the e2e bench's CPU tests build (every shipped spec
accepts its linear shapes: K = 256 and 512, N a multiple of 8)."""
TINY = dict(model_type="llama", hidden_size=256, intermediate_size=512, num_attention_heads=4,
            num_key_value_heads=2, num_hidden_layers=2, vocab_size=512, max_position_embeddings=256)
