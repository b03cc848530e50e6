%% ewl.erl - Erlang workloads for the profiler's BEAM tests.
%%
%% Run: erl -noshell -pa DIR -s ewl main MODE SECONDS
%% Prints "hot phase from <unix time> to <unix time>" once the measured phase
%% is over; with WORKLOAD_HOLD set it then prints "holding" and waits for
%% its standard input to end. Lines whose comment is %# hot and a name are where the tests
%% expect each frame; test/integration/beam_test.go reads the marks.
%%
%% chain: leaf/2, a frameless tail-recursive loop (no stack frame of its
%% own: its caller's continuation pointer is the top of the Erlang stack),
%% called by mid/1, called by top/1.
%% procs: four processes spawned with a fun that calls top/1, each in the
%% chain; the stack of each ends with the fun.
%% bif: the hot code is C: lists:reverse/1 (a BIF) called by bif_mid/2,
%% called by bif_top/1.
%% nif: the hot code is a NIF's: zlib:compress/1 (the emulator's zlib NIFs
%% calling zlib) on about 4 KB, called by nif_mid/2, called by nif_top/1.
%% dirty: the hot code is the garbage collector on a dirty CPU scheduler:
%% erlang:garbage_collect/0 on a heap of a million-element list (a major
%% collection of a large heap runs on a dirty CPU scheduler thread,
%% erts_dcpus_N), called by dirty_mid/2, called by dirty_top/1.
%% dirty_io: the hot code is a dirty I/O NIF's: prim_file:read_file/1 (its
%% NIFs run on dirty I/O scheduler threads, erts_dios_N; file:read_file/1
%% would run it in the file server's process) on a 4 MB file, called by
%% dio_mid/2, called by dio_top/1.
-module(ewl).
-export([main/1]).

main([Mode, Seconds]) ->
    Ms = round(list_to_float(atom_to_list(Seconds)) * 1000),
    warm(Mode),
    From = now_s(),
    Deadline = erlang:monotonic_time(millisecond) + Ms,
    run(Mode, Deadline), %# hot: main
    io:format("hot phase from ~.6f to ~.6f~n", [From, now_s()]),
    case os:getenv("WORKLOAD_HOLD") of
        false -> ok;
        _ -> io:format("holding~n"), hold()
    end,
    halt(0).

now_s() -> erlang:system_time(microsecond) / 1.0e6.

%% Before the hot phase: dirty_io reads its file for a second, so that the
%% profiler knows the C library's code (every sample of it is in read)
%% when the hot phase starts.
warm(dirty_io) ->
    Path = dio_path(),
    ok = file:write_file(Path, binary:copy(<<"0123456789abcdef">>, 262144)),
    dio_mid(Path, erlang:monotonic_time(millisecond) + 1000);
warm(_) -> ok.

hold() ->
    case io:get_line("") of
        eof -> ok;
        {error, _} -> ok;
        _ -> hold()
    end.

run(chain, Deadline) -> top(Deadline);
run(procs, Deadline) ->
    Parent = self(),
    Pids = [spawn_link(fun() -> top(Deadline), Parent ! {done, self()} end) || _ <- lists:seq(1, 4)], %# hot: procs
    [receive {done, Pid} -> ok end || Pid <- Pids],
    ok;
run(bif, Deadline) -> bif_top(Deadline);
run(nif, Deadline) -> nif_top(Deadline);
run(dirty, Deadline) -> dirty_top(Deadline);
run(dirty_io, Deadline) -> dio_top(Deadline).

top(Deadline) ->
    mid(Deadline), %# hot: top
    ok.

mid(Deadline) ->
    N = leaf(200000, 0), %# hot: mid
    case erlang:monotonic_time(millisecond) < Deadline of
        true -> mid(Deadline);
        false -> N
    end.

leaf(0, Acc) -> Acc; %# hot: leaf0
%% Each call (a reduction: the scheduler switches processes every few
%% thousand) does some arithmetic, so that switching stays a small share.
leaf(N, Acc) -> leaf(N - 1, ((Acc bxor N) * 7 + (N band 3) * 13 + (Acc bsr 3)) band 16#fffff). %# hot: leaf

bif_top(Deadline) ->
    L = lists:seq(1, 2000),
    bif_mid(L, Deadline), %# hot: bif_top
    ok.

bif_mid(L, Deadline) ->
    R = lists:reverse(L), %# hot: bif_mid
    case erlang:monotonic_time(millisecond) < Deadline of
        true -> bif_mid(R, Deadline);
        false -> length(R)
    end.

nif_top(Deadline) ->
    B = list_to_binary([integer_to_list(I) || I <- lists:seq(1, 1200)]),
    nif_mid(B, Deadline), %# hot: nif_top
    ok.

nif_mid(B, Deadline) ->
    Z = zlib:compress(B), %# hot: nif_mid
    case erlang:monotonic_time(millisecond) < Deadline of
        true -> nif_mid(B, Deadline);
        false -> byte_size(Z)
    end.

dirty_top(Deadline) ->
    L = lists:seq(1, 1000000),
    dirty_mid(L, Deadline), %# hot: dirty_top
    ok.

dirty_mid(L, Deadline) ->
    erlang:garbage_collect(), %# hot: dirty_mid
    case erlang:monotonic_time(millisecond) < Deadline of
        true -> dirty_mid(L, Deadline);
        false -> length(L)
    end.

dio_path() -> filename:join(os:getenv("TMPDIR", "/tmp"), "ewl-" ++ os:getpid() ++ ".bin").

dio_top(Deadline) ->
    Path = dio_path(),
    dio_mid(Path, Deadline), %# hot: dio_top
    file:delete(Path).

dio_mid(Path, Deadline) ->
    {ok, B} = prim_file:read_file(Path), %# hot: dio_mid
    case erlang:monotonic_time(millisecond) < Deadline of
        true -> dio_mid(Path, Deadline);
        false -> byte_size(B)
    end.
