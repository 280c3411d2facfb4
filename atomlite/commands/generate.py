"""`atomlite generate`: a completion for each prompt, offline."""
import click

from atomlite.commands.options import engine_args, engine_options, fail, model_dir
from atomlite.errors import ConfigError


@click.command()
@engine_options
@click.argument("prompts", nargs=-1, required=True)
@click.option("--max-tokens", type=int, default=32, show_default=True, help="Tokens to generate per prompt.")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="Nucleus sampling mass (1 = off).")
@click.option("--top-k", type=int, default=-1, show_default=True, help="Sample among the k most likely (-1 = off).")
@click.option("--seed", type=int, default=None, help="Seed of the sampling (the engine's by default).")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
def generate(prompts, max_tokens, temperature, top_p, top_k, seed, stop, **kw):
    """Generate a completion for each PROMPT."""
    from atomlite import LLM, SamplingParams
    from atomlite.config import EngineConfig
    from atomlite.tokenizer import require_tokenizer
    try:
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens,
                                seed=seed, stop=list(stop))
        require_tokenizer(EngineConfig(model=model_dir(kw), **engine_args(kw)).tokenizer_path)  # before the weights
        llm = LLM(model_dir(kw), **engine_args(kw))
        outputs = llm.generate(list(prompts), params)
    except (ConfigError, ValueError) as e:
        fail(str(e))
    for prompt, out in zip(prompts, outputs):
        completion = out.outputs[0]
        click.echo(f"--- {prompt!r} ({len(completion.token_ids)} tokens, {completion.finish_reason})")
        click.echo(prompt + completion.text)
