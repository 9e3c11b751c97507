"""vllm-idlm beyond one machine, on Ray's own LLM stack (never a home-made one).

- `vllm_idlm.on_ray.data`: offline batch ISD over a Ray Dataset with N vLLM engine replicas
  (`ray.data.llm`), also the scale-out path of the training package's self-rollouts;
- `vllm_idlm.on_ray.serve`: an OpenAI-compatible Ray Serve LLM app with the idlm config;
- `idlm_training.ray_train`: `idlm-train` stages under Ray Train's `TorchTrainer`.

Install with the `ray` extra (`ray[data,serve,train]`, pinned beside vLLM 0.32); never
`ray[llm]`, which pins a different vLLM. The plugin reaches every Ray worker the same way it
reaches vLLM's own processes: vLLM loads its `vllm.general_plugins` entry point in each one.
"""
