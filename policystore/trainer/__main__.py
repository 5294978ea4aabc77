"""python -m policystore.trainer: train an AlphaStar-style Connect Four league on a local Ray.

Main agents, main exploiters and league exploiters learn with PPO in learner shards; thin rollout workers
play them against each other and against frozen snapshots, which the node's PolicyStore keeps once in
shared memory for all workers. At the end: players with Elo, a payoff heatmap, a learning curve (with the
main agent against OpenSpiel's MCTS(100) at a few points of the run, played after training) and the store's
memory report under RUN_DIR/report/.

examples:
  python -m policystore.trainer --run-dir runs/quickstart            # default run (see --minutes)
  python -m policystore.trainer --run-dir runs/quickstart --resume --minutes 2
  python -m policystore.trainer.evaluate --run-dir runs/quickstart   # win rates vs scripted players, both seats
  python -m policystore.trainer.play --run-dir runs/quickstart       # play against the main agent in the terminal
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from policystore import logs
from policystore.league.games import GAME_HELP, get_game
from policystore.league.vecgame import check_game
from policystore.trainer.config import DEFAULT_MINUTES, TrainConfig
from policystore.trainer.run import train_in
from policystore.trainer.rundir import prepare_run_dir
from policystore.trainer.usage import bad_input

PROG = "python -m policystore.trainer"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = TrainConfig()
    dl = d.league
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", required=True, help="where config, league state, store spill files, "
                   "checkpoints and the report go")
    p.add_argument("--minutes", type=float, default=None,
                   help=f"training time (default {DEFAULT_MINUTES:g}; with --resume: the saved run's value)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --run-dir with its saved config (only --minutes applies)")
    p.add_argument("--game", default=d.game, help=f"{GAME_HELP} (default {d.game}; docs/own-game.md)")
    p.add_argument("--workers", type=int, default=d.workers, help=f"rollout workers (default {d.workers})")
    p.add_argument("--games-per-match", type=int, default=d.games_per_match,
                   help=f"games a worker plays at once per match (default {d.games_per_match})")
    p.add_argument("--main-agents", type=int, default=dl.main_agents, help=f"default {dl.main_agents}")
    p.add_argument("--main-exploiters", type=int, default=dl.main_exploiters, help=f"default {dl.main_exploiters}")
    p.add_argument("--league-exploiters", type=int, default=dl.league_exploiters,
                   help=f"default {dl.league_exploiters}")
    p.add_argument("--hidden", type=int, default=d.hidden, help=f"policy net width (default {d.hidden})")
    p.add_argument("--gpus-per-learner", type=float, default=d.learner_gpus,
                   help="GPU share per learner shard, e.g. 0.3 for three shards on one GPU (default 0: CPU)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs for the local Ray (default: all)")
    p.add_argument("--reference-games", type=int, default=d.reference_games,
                   help="games per seat for each point of main_0 against OpenSpiel's MCTS(100), played after "
                   f"training (default {d.reference_games}; 0: skip)")
    p.add_argument("--main-share", type=float, default=dl.main_share,
                   help=f"share of all env steps the main agents get (default {dl.main_share:g}); exploiters: the rest")
    p.add_argument("--scripted", default=",".join(dl.scripted),
                   help="comma-separated scripted players the main agents meet (Connect Four: random, winblock, "
                   f"safe; default {','.join(dl.scripted)})")
    p.add_argument("--scripted-share", type=float, default=dl.scripted_share,
                   help="share of the main agents' matches against the scripted players, picked uniformly "
                   f"(Connect Four; default {dl.scripted_share:g}; 0: none)")
    p.add_argument("--no-mirror", action="store_true",
                   help="train on the positions as played, not on randomly mirrored ones")
    p.add_argument("--opening-share", type=float, default=d.opening_share,
                   help="share of the games that start after a random opening of 1 to "
                   f"{d.opening_moves} moves (Connect Four; default {d.opening_share:g}; 0: none)")
    p.add_argument("--ppo-epochs", type=int, default=d.ppo.epochs,
                   help=f"PPO epochs per batch (default {d.ppo.epochs})")
    p.add_argument("--publish-every", type=int, default=d.publish_every,
                   help=f"learner updates between the versions a learner publishes (default {d.publish_every})")
    p.add_argument("--lr-final", type=float, default=d.ppo.lr_final,
                   help=f"anneal the learning rate linearly from {d.ppo.lr:g} to this by the run's end "
                   "(default: constant)")
    p.add_argument("--entropy-coef", type=float, default=d.ppo.entropy_coef,
                   help=f"PPO's entropy bonus (default {d.ppo.entropy_coef:g})")
    p.add_argument("--tactics-coef", type=float, default=d.ppo.tactics_coef,
                   help="weight of a loss towards the moves a short look-ahead proves right (win at once, else block, "
                   "else make a double threat, else avoid the moves that let the opponent make one; Connect "
                   f"Four; default {d.ppo.tactics_coef:g}; 0: none)")
    p.add_argument("--search-coef", type=float, default=d.ppo.search_coef,
                   help="weight of a loss towards a tree search's visit shares (the net as prior and value) on "
                   f"some positions of each batch (Connect Four; default {d.ppo.search_coef:g}; 0: none)")
    p.add_argument("--search-positions", type=int, default=d.ppo.search_positions,
                   help=f"positions of each batch searched for that loss (default {d.ppo.search_positions})")
    p.add_argument("--search-sims", type=int, default=d.ppo.search_sims,
                   help=f"simulations per searched position (default {d.ppo.search_sims})")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also print policystore's informational log lines, from every process of the run")
    return p.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The run's config: the defaults with what the command line sets. Scripted players, random openings, the
    tactics and the search loss apply where the game has them (Connect Four's); other games train without them."""
    d = TrainConfig()
    game = get_game(args.game)
    scripted = tuple(n for n in args.scripted.split(",") if n) if args.scripted_share else ()
    if scripted == d.league.scripted and not set(scripted) <= set(game.baselines):
        scripted = ()  # the default's players are Connect Four's; a name typed for another game is refused below
    return TrainConfig(
        minutes=args.minutes if args.minutes is not None else DEFAULT_MINUTES, game=args.game, seed=args.seed,
        workers=args.workers, games_per_match=args.games_per_match, hidden=args.hidden,
        learner_gpus=args.gpus_per_learner, num_cpus=args.num_cpus, reference_games=args.reference_games,
        publish_every=args.publish_every, mirror=not args.no_mirror,
        opening_share=args.opening_share if game.opening else 0.0,
        ppo=dataclasses.replace(d.ppo, epochs=args.ppo_epochs, entropy_coef=args.entropy_coef,
                                lr_final=args.lr_final, tactics_coef=args.tactics_coef if game.tactics else 0.0,
                                search_coef=args.search_coef if game.search else 0.0,
                                search_positions=args.search_positions, search_sims=args.search_sims),
        league=dataclasses.replace(d.league, main_agents=args.main_agents, main_exploiters=args.main_exploiters,
                                   league_exploiters=args.league_exploiters, main_share=args.main_share,
                                   scripted=scripted, scripted_share=args.scripted_share if scripted else 0.0))


def main(argv: list[str] | None = None) -> int:
    """Everything the command line says is checked before Ray starts: the run folder, the game, the settings."""
    args = parse_args(argv)
    if args.verbose:
        logs.verbose()
    config = None
    if not args.resume:
        with bad_input(PROG, f"--game {args.game}"):
            check_game(get_game(args.game))  # it exists, is installed, and the league can play it
        with bad_input(PROG):
            config = config_from_args(args)
    with bad_input(PROG, "--run-dir"):
        rd, config = prepare_run_dir(args.run_dir, config, args.resume)
    train_in(rd, config, args.resume, args.minutes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
