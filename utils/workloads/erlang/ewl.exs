# ewl.exs MODE SECONDS - the Elixir workload of the profiler's BEAM tests
# (run with elixir; see ewl.erl for the protocol).
#
# chain: EwlChain.leaf/2, a frameless tail-recursive loop, called by
# EwlChain.mid/1, called by EwlChain.top/1, called by the script's code.
defmodule EwlChain do
  def top(deadline) do
    mid(deadline) # hot: ex_top
    :ok
  end

  def mid(deadline) do
    n = leaf(200_000, 0) # hot: ex_mid
    if System.monotonic_time(:millisecond) < deadline, do: mid(deadline), else: n
  end

  def leaf(0, acc), do: acc # hot: ex_leaf0
  # Some arithmetic per call (a reduction), as in ewl.erl.
  def leaf(n, acc), do: leaf(n - 1, Bitwise.band(Bitwise.bxor(acc, n) * 7 + Bitwise.band(n, 3) * 13 + Bitwise.bsr(acc, 3), 0xFFFFF)) # hot: ex_leaf
end

defmodule EwlHold do
  def hold do
    case IO.gets("") do
      :eof -> :ok
      {:error, _} -> :ok
      _ -> hold()
    end
  end
end

[_mode, secs] = System.argv()
ms = round(String.to_float(secs) * 1000)
from = System.os_time(:microsecond) / 1.0e6
EwlChain.top(System.monotonic_time(:millisecond) + ms) # hot: ex_main
:io.format("hot phase from ~.6f to ~.6f~n", [from, System.os_time(:microsecond) / 1.0e6])

if System.get_env("WORKLOAD_HOLD") do
  IO.puts("holding")
  EwlHold.hold()
end
