# plworkload.pl MODE SECONDS - Perl workloads for the profiler's Perl tests.
#
# Prints "hot phase from <unix time>" when the measured phase starts, then
# spins for SECONDS. Lines marked "# hot: NAME" are where the tests expect
# each frame; test/integration/perl_test.go reads the marks.
#
# chain: Leafy::leaf (a sub with a glob), called by Chain::mid, called by
# main::top (a sub of package main: a named CV, no glob), from the file's
# code.
# threads: four ithreads named t0-t3, each in its own chain
# tN_leaf <- tN_mid <- tN_top.
# fork: four forked children, child N in the chain tN_leaf <- tN_mid <-
# tN_top; each prints "child N PID".
# eval: the chain through an eval {} and a string eval: eleaf, called from
# the string eval's code, in emid, in an eval {} in etop.
# recursion: leaf under main::rec recursing 40 deep (more contexts than
# one run of the BPF unwinder walks).
# sort: leaf called from a sort comparator sub (sort runs it in a runops
# loop of its own, from C): Leafy::leaf <- main::by_leaf <- main::sorter.
use strict;
use warnings;
use Time::HiRes ();

sub now { Time::HiRes::clock_gettime(Time::HiRes::CLOCK_MONOTONIC()) }

package Leafy;

# leaf runs in short calls; it says whether the deadline is still ahead.
sub leaf {
    my ($deadline) = @_;
    my $x = 0;
    while ($x < 20000) { $x++ }    # hot: leaf
    return main::now() < $deadline;
}

package Chain;

sub mid {
    my ($deadline) = @_;
    1 while Leafy::leaf($deadline);    # hot: mid
}

package main;

sub top { Chain::mid($_[0]) }    # hot: top

sub t0_leaf { my $x = 0; while (1) { $x++; last if $x % 100000 == 0 && now() > $_[0] } }    # hot: t0_leaf
sub t0_mid  { t0_leaf($_[0]) }                                                                # hot: t0_mid
sub t0_top  { t0_mid($_[0]) }                                                                 # hot: t0_top
sub t1_leaf { my $x = 0; while (1) { $x++; last if $x % 100000 == 0 && now() > $_[0] } }    # hot: t1_leaf
sub t1_mid  { t1_leaf($_[0]) }                                                                # hot: t1_mid
sub t1_top  { t1_mid($_[0]) }                                                                 # hot: t1_top
sub t2_leaf { my $x = 0; while (1) { $x++; last if $x % 100000 == 0 && now() > $_[0] } }    # hot: t2_leaf
sub t2_mid  { t2_leaf($_[0]) }                                                                # hot: t2_mid
sub t2_top  { t2_mid($_[0]) }                                                                 # hot: t2_top
sub t3_leaf { my $x = 0; while (1) { $x++; last if $x % 100000 == 0 && now() > $_[0] } }    # hot: t3_leaf
sub t3_mid  { t3_leaf($_[0]) }                                                                # hot: t3_mid
sub t3_top  { t3_mid($_[0]) }                                                                 # hot: t3_top

sub eleaf { my $x = 0; while (1) { $x++; last if $x % 100000 == 0 && now() > $_[0] } }    # hot: eleaf
sub emid  { my $d = $_[0]; eval "eleaf(\$d);\n1" or die $@ }                                # hot: emid
sub etop  { eval { emid($_[0]); 1 } or die $@ }                                              # hot: etop

sub rec { my ($n, $d) = @_; if ($n) { rec($n - 1, $d) } else { 1 while Leafy::leaf($d) } }    # hot: rec

sub by_leaf { Leafy::leaf($main::sort_deadline); $a <=> $b }    # hot: by_leaf
sub sorter {
    my ($deadline) = @_;
    $main::sort_deadline = $deadline;
    my @x = sort by_leaf 1 .. 8 while now() < $deadline;    # hot: sorter
}

# thread_name names the calling thread (its comm, as prctl(PR_SET_NAME)
# would, on any architecture): the tests tell the threads apart by it.
sub thread_name {
    open my $comm, '>', '/proc/thread-self/comm' or die "naming the thread: $!";
    print $comm $_[0];
    close $comm or die "naming the thread: $!";
}

my ($mode, $seconds) = @ARGV;
die "usage: $0 chain|threads|fork|eval|sort|recursion SECONDS\n"
  unless defined $seconds && $mode =~ /^(chain|threads|fork|eval|sort|recursion)$/;
if ($mode eq 'threads') { require threads; }
$| = 1;
printf "hot phase from %.6f\n", Time::HiRes::time();
my $deadline = now() + $seconds;
# One statement per call of a chain: caller() (and so the frames) give a
# statement in an if/elsif block the line of the if.
top($deadline) if $mode eq 'chain';       # hot: main
etop($deadline) if $mode eq 'eval';       # hot: eval main
sorter($deadline) if $mode eq 'sort';     # hot: sort main
rec(40, $deadline) if $mode eq 'recursion';    # hot: recursion main
if ($mode eq 'threads') {
    my @t = map {
        my $i = $_;
        threads->create(sub { thread_name("t$i"); no strict 'refs'; &{"t${i}_top"}($deadline) });
    } 0 .. 3;
    $_->join for @t;
}
if ($mode eq 'fork') {
    my @pids;
    for my $i (0 .. 3) {
        my $pid = fork // die "fork: $!";
        if (!$pid) {
            print "child $i $$\n";
            no strict 'refs';
            &{"t${i}_top"}($deadline);
            exit 0;
        }
        push @pids, $pid;
    }
    waitpid $_, 0 for @pids;
}
# WORKLOAD_HOLD: the process stays, its memory readable, until its
# standard input ends, after saying so: a test stops profiling first, so
# that the daemon symbolizes every sample while the process lives.
if ($ENV{WORKLOAD_HOLD}) {
    print "holding\n";
    1 while <STDIN>;
}
