# bash completion for ibtool(8): ibtool completion bash
# Installed as /usr/share/bash-completion/completions/ibtool (or in
# ~/.local/share/bash-completion/completions/ibtool). Device and port names are read
# from DIR/sys/class/infiniband when Tab is pressed (DIR: --root's, else /).

# Generated from ibtool's argument parser by `ibtool completion`: do not edit.

# The command names and aliases.
_ibtool_commands() {
    _ibtool_r=(completion counters stats dev device doctor exporter fabric gids gid health loopback mesh monitor ping plugins port link res resource snapshot system topo tui)
}

# A command's name or alias -> its name (empty when it is none).
_ibtool_command() {
    case $1 in
        completion) _ibtool_name=completion ;;
        counters|stats) _ibtool_name=counters ;;
        dev|device) _ibtool_name=dev ;;
        doctor) _ibtool_name=doctor ;;
        exporter) _ibtool_name=exporter ;;
        fabric) _ibtool_name=fabric ;;
        gids|gid) _ibtool_name=gids ;;
        health) _ibtool_name=health ;;
        loopback) _ibtool_name=loopback ;;
        mesh) _ibtool_name=mesh ;;
        monitor) _ibtool_name=monitor ;;
        ping) _ibtool_name=ping ;;
        plugins) _ibtool_name=plugins ;;
        port|link) _ibtool_name=port ;;
        res|resource) _ibtool_name=res ;;
        snapshot) _ibtool_name=snapshot ;;
        system) _ibtool_name=system ;;
        topo) _ibtool_name=topo ;;
        tui) _ibtool_name=tui ;;
        *) _ibtool_name= ;;
    esac
}

# The options of a command ("": ibtool's own, before the command).
_ibtool_options() {
    case $1 in
        '') _ibtool_r=(-h --help -V --version -j --json -p --pretty -d --details --root --snapshot --snapshot-limit --debug) ;;
        completion) _ibtool_r=(-h --help -j --json -p --pretty -d --details --root --snapshot --snapshot-limit --debug) ;;
        counters) _ibtool_r=(-h --help -j --json -p --pretty -d --details --root --snapshot --snapshot-limit --debug --rate --interval --watch --errors --explain) ;;
        dev) _ibtool_r=(-h --help -j --json -p --pretty -d --details --root --snapshot --snapshot-limit --debug) ;;
        doctor) _ibtool_r=(-h --help -j --json -p --pretty -d --details --root --snapshot --snapshot-limit --debug --dev --port --compat --gid-index --tclass -c --count --size --timeout --no-probe --pid) ;;
        exporter) _ibtool_r=(-h --help -j --json -p --pretty -d --details --root --snapshot --snapshot-limit --debug --listen --interval --config --skip --web.max-requests --web.config.file --fabric --fabric-interval --fabric-via --fabric-mads --fabric-timeout --fabric-retries) ;;
        fabric) _ibtool_r=(-h --help -j --json -p --pretty -d --details --root --snapshot --snapshot-limit --debug --wait --against --thresholds --state --all-ports --no-state --via --timeout --retries --max-smps) ;;
        gids) _ibtool_r=(-h --help -j --json -p --pretty -d --details --root --snapshot --snapshot-limit --debug --type --netdev --ip --port --best) ;;
        health) _ibtool_r=(-h --help -j --json -p --pretty -d --details --root --snapshot --snapshot-limit --debug --config --state --no-state --lock-wait --check --skip --datapath --textfile --slurm-drain -v --verbose --list --print-nhc) ;;
        loopback) _ibtool_r=(-h --help -j --json -p --pretty -d --details --root --snapshot --snapshot-limit --debug --ops --size --iters --gid-index --pkey-index --timeout --depth --sl --qkey) ;;
        mesh) _ibtool_r=(-h --help -j --json -p --pretty -d --details --root --snapshot --snapshot-limit --debug --srun --local --agent --connect --detach --dev --exclude --rail --all-rails -c --count --size --mode --rate --timeout --qp-timeout --tclass --sl --gid-index --pkey-index --full-payload --qps --bw --rounds --deadline --abandon --slow --tcp-port --fanout --listen --ibtool --start-timeout --textfile --plot --no-save) ;;
        monitor) _ibtool_r=(-h --help -j --json -p --pretty -d --details --root --snapshot --snapshot-limit --debug --interval --count --timeout) ;;
        ping) _ibtool_r=(-h --help -j --json -p --pretty -d --details --root --snapshot --snapshot-limit --debug --server --compat --cm --sl --tclass --mtu -q --quiet --qp-timeout --hw-timestamps --bind --port --dev --gid-index --pkey-index --mode -c --count -i --interval -s --size -w --deadline -W --timeout --max-sessions --max-per-source --idle-timeout --max-rate --max-memory --allow --no-facts) ;;
        plugins) _ibtool_r=(-h --help -j --json -p --pretty -d --details --root --snapshot --snapshot-limit --debug) ;;
        port) _ibtool_r=(-h --help -j --json -p --pretty -d --details --root --snapshot --snapshot-limit --debug) ;;
        res) _ibtool_r=(-h --help -j --json -p --pretty -d --details --root --snapshot --snapshot-limit --debug) ;;
        snapshot) _ibtool_r=(-h --help -j --json -p --pretty -d --details --root --snapshot --snapshot-limit --debug --fabric --via) ;;
        system) _ibtool_r=(-h --help -j --json -p --pretty -d --details --root --snapshot --snapshot-limit --debug) ;;
        topo) _ibtool_r=(-h --help -j --json -p --pretty -d --details --root --snapshot --snapshot-limit --debug --nccl) ;;
        tui) _ibtool_r=(-h --help -j --json -p --pretty -d --details --root --snapshot --snapshot-limit --debug --interval --health-interval --fabric-interval --config) ;;
        *) _ibtool_r=() ;;
    esac
}

# Whether option $2 of command $1 takes a value, and its kind and choices.
_ibtool_value() {
    _ibtool_kind= _ibtool_r=()
    case "$1 $2" in
        ' --root') _ibtool_kind=dir ;;
        ' --snapshot') _ibtool_kind=file ;;
        ' --snapshot-limit') _ibtool_kind=none ;;
        'completion --root') _ibtool_kind=dir ;;
        'completion --snapshot') _ibtool_kind=file ;;
        'completion --snapshot-limit') _ibtool_kind=none ;;
        'counters --root') _ibtool_kind=dir ;;
        'counters --snapshot') _ibtool_kind=file ;;
        'counters --snapshot-limit'|'counters --interval'|'counters --watch'|'counters --explain') _ibtool_kind=none ;;
        'dev --root') _ibtool_kind=dir ;;
        'dev --snapshot') _ibtool_kind=file ;;
        'dev --snapshot-limit') _ibtool_kind=none ;;
        'doctor --root') _ibtool_kind=dir ;;
        'doctor --snapshot') _ibtool_kind=file ;;
        'doctor --snapshot-limit'|'doctor --port'|'doctor --gid-index'|'doctor --tclass'|'doctor -c'|'doctor --count'|'doctor --size'|'doctor --timeout'|'doctor --pid') _ibtool_kind=none ;;
        'doctor --dev') _ibtool_kind=devport ;;
        'doctor --compat') _ibtool_kind=choices _ibtool_r=(rc_pingpong rping) ;;
        'exporter --root') _ibtool_kind=dir ;;
        'exporter --snapshot'|'exporter --config'|'exporter --web.config.file') _ibtool_kind=file ;;
        'exporter --snapshot-limit'|'exporter --listen'|'exporter --interval'|'exporter --skip'|'exporter --web.max-requests'|'exporter --fabric-interval'|'exporter --fabric-mads'|'exporter --fabric-timeout'|'exporter --fabric-retries') _ibtool_kind=none ;;
        'exporter --fabric-via') _ibtool_kind=devport ;;
        'fabric --root') _ibtool_kind=dir ;;
        'fabric --snapshot'|'fabric --against'|'fabric --thresholds'|'fabric --state') _ibtool_kind=file ;;
        'fabric --snapshot-limit'|'fabric --wait'|'fabric --timeout'|'fabric --retries'|'fabric --max-smps') _ibtool_kind=none ;;
        'fabric --via') _ibtool_kind=devport ;;
        'gids --root') _ibtool_kind=dir ;;
        'gids --snapshot') _ibtool_kind=file ;;
        'gids --snapshot-limit'|'gids --netdev'|'gids --ip'|'gids --best') _ibtool_kind=none ;;
        'gids --type') _ibtool_kind=choices _ibtool_r=(ib v1 v2) ;;
        'gids --port') _ibtool_kind=port ;;
        'health --root') _ibtool_kind=dir ;;
        'health --snapshot'|'health --config'|'health --state'|'health --textfile') _ibtool_kind=file ;;
        'health --snapshot-limit'|'health --lock-wait'|'health --check'|'health --skip') _ibtool_kind=none ;;
        'loopback --root') _ibtool_kind=dir ;;
        'loopback --snapshot') _ibtool_kind=file ;;
        'loopback --snapshot-limit'|'loopback --ops'|'loopback --size'|'loopback --iters'|'loopback --gid-index'|'loopback --pkey-index'|'loopback --timeout'|'loopback --depth'|'loopback --sl'|'loopback --qkey') _ibtool_kind=none ;;
        'mesh --root') _ibtool_kind=dir ;;
        'mesh --snapshot'|'mesh --textfile'|'mesh --plot') _ibtool_kind=file ;;
        'mesh --snapshot-limit'|'mesh --connect'|'mesh -c'|'mesh --count'|'mesh --size'|'mesh --rate'|'mesh --timeout'|'mesh --qp-timeout'|'mesh --tclass'|'mesh --sl'|'mesh --gid-index'|'mesh --pkey-index'|'mesh --full-payload'|'mesh --qps'|'mesh --rounds'|'mesh --deadline'|'mesh --abandon'|'mesh --slow'|'mesh --tcp-port'|'mesh --fanout'|'mesh --listen'|'mesh --ibtool'|'mesh --start-timeout') _ibtool_kind=none ;;
        'mesh --dev'|'mesh --exclude'|'mesh --rail') _ibtool_kind=devport ;;
        'mesh --mode') _ibtool_kind=choices _ibtool_r=(send write-imm) ;;
        'monitor --root') _ibtool_kind=dir ;;
        'monitor --snapshot') _ibtool_kind=file ;;
        'monitor --snapshot-limit'|'monitor --interval'|'monitor --count'|'monitor --timeout') _ibtool_kind=none ;;
        'ping --root') _ibtool_kind=dir ;;
        'ping --snapshot') _ibtool_kind=file ;;
        'ping --snapshot-limit'|'ping --sl'|'ping --tclass'|'ping --qp-timeout'|'ping --bind'|'ping --port'|'ping --gid-index'|'ping --pkey-index'|'ping -c'|'ping --count'|'ping -i'|'ping --interval'|'ping -s'|'ping --size'|'ping -w'|'ping --deadline'|'ping -W'|'ping --timeout'|'ping --max-sessions'|'ping --max-per-source'|'ping --idle-timeout'|'ping --max-rate'|'ping --max-memory'|'ping --allow'|'ping --max-clients') _ibtool_kind=none ;;
        'ping --compat') _ibtool_kind=choices _ibtool_r=(rc_pingpong rping) ;;
        'ping --mtu') _ibtool_kind=choices _ibtool_r=(256 512 1024 2048 4096) ;;
        'ping --dev') _ibtool_kind=devport ;;
        'ping --mode') _ibtool_kind=choices _ibtool_r=(send write-imm) ;;
        'plugins --root') _ibtool_kind=dir ;;
        'plugins --snapshot') _ibtool_kind=file ;;
        'plugins --snapshot-limit') _ibtool_kind=none ;;
        'port --root') _ibtool_kind=dir ;;
        'port --snapshot') _ibtool_kind=file ;;
        'port --snapshot-limit') _ibtool_kind=none ;;
        'res --root') _ibtool_kind=dir ;;
        'res --snapshot') _ibtool_kind=file ;;
        'res --snapshot-limit') _ibtool_kind=none ;;
        'snapshot --root') _ibtool_kind=dir ;;
        'snapshot --snapshot') _ibtool_kind=file ;;
        'snapshot --snapshot-limit') _ibtool_kind=none ;;
        'snapshot --via') _ibtool_kind=devport ;;
        'system --root') _ibtool_kind=dir ;;
        'system --snapshot') _ibtool_kind=file ;;
        'system --snapshot-limit') _ibtool_kind=none ;;
        'topo --root') _ibtool_kind=dir ;;
        'topo --snapshot') _ibtool_kind=file ;;
        'topo --snapshot-limit') _ibtool_kind=none ;;
        'tui --root') _ibtool_kind=dir ;;
        'tui --snapshot'|'tui --config') _ibtool_kind=file ;;
        'tui --snapshot-limit'|'tui --interval'|'tui --health-interval'|'tui --fabric-interval') _ibtool_kind=none ;;
        *) return 1 ;;
    esac
}

# Positional word $2 (0: the first after the command) of command $1: its kind, and the
# keywords it may be.
_ibtool_positional() {
    _ibtool_kind= _ibtool_r=()
    case $1 in
        completion)
            case $2 in
                0) _ibtool_kind=none _ibtool_r=(bash zsh) ;;
            esac ;;
        counters)
            case $2 in
                0) _ibtool_kind=devport _ibtool_r=(show optional enable disable) ;;
                *) (( $2 > 0 )) && _ibtool_kind=devport ;;
            esac ;;
        dev)
            case $2 in
                0) _ibtool_kind=devport _ibtool_r=(show) ;;
                *) (( $2 > 0 )) && _ibtool_kind=devport ;;
            esac ;;
        doctor)
            case $2 in
                0) _ibtool_kind=host ;;
            esac ;;
        fabric)
            case $2 in
                0) _ibtool_kind=none _ibtool_r=(links errors sm route) ;;
                *) (( $2 > 0 )) && _ibtool_kind=none ;;
            esac ;;
        gids)
            case $2 in
                0) _ibtool_kind=devport _ibtool_r=(show) ;;
                *) (( $2 > 0 )) && _ibtool_kind=devport ;;
            esac ;;
        loopback)
            case $2 in
                0) _ibtool_kind=devport ;;
                *) (( $2 > 0 )) && _ibtool_kind=devport ;;
            esac ;;
        mesh)
            case $2 in
                0) _ibtool_kind=none ;;
            esac ;;
        ping)
            case $2 in
                0) _ibtool_kind=host ;;
            esac ;;
        port)
            case $2 in
                0) _ibtool_kind=devport _ibtool_r=(show) ;;
                *) (( $2 > 0 )) && _ibtool_kind=devport ;;
            esac ;;
        res)
            case $2 in
                0) _ibtool_kind=devport _ibtool_r=(show) ;;
                *) (( $2 > 0 )) && _ibtool_kind=devport ;;
            esac ;;
        snapshot)
            case $2 in
                0) _ibtool_kind=none _ibtool_r=(save show diff) ;;
                *) (( $2 > 0 )) && _ibtool_kind=file ;;
            esac ;;
        system)
            case $2 in
                0) _ibtool_kind=none _ibtool_r=(show set) ;;
                *) (( $2 > 0 )) && _ibtool_kind=none ;;
            esac ;;
    esac
}

# Add each word of "$@" that begins with $_ibtool_cur to COMPREPLY, quoted for the line.
_ibtool_add() {
    local w q
    for w in "$@"; do
        [[ $w == "$_ibtool_cur"* ]] || continue
        printf -v q '%q' "$w"
        COMPREPLY+=("$_ibtool_pre$q")
    done
}

# The RDMA devices under $_ibtool_root, into _ibtool_r: names only, never evaluated.
_ibtool_devices() {
    local d
    _ibtool_r=()
    for d in "${_ibtool_root%/}"/sys/class/infiniband/*; do
        [[ -e $d || -L $d ]] && _ibtool_r+=("${d##*/}")
    done
}

# The port numbers of device $1 (of every device when $1 is empty), into _ibtool_r.
_ibtool_ports() {
    local d p seen=" "
    local -a devices
    if [[ -n $1 ]]; then devices=("$1"); else _ibtool_devices; devices=("${_ibtool_r[@]}"); fi
    _ibtool_r=()
    for d in "${devices[@]}"; do
        for p in "${_ibtool_root%/}/sys/class/infiniband/$d/ports"/*; do
            [[ -e $p ]] || continue
            p=${p##*/}
            [[ $seen == *" $p "* ]] && continue
            seen+="$p "
            _ibtool_r+=("$p")
        done
    done
}

# Complete a value of kind $1 (choices: the words in _ibtool_r).
_ibtool_complete() {
    local dev w
    local -a found
    case $1 in
        choices) _ibtool_add "${_ibtool_r[@]}" ;;
        file|dir)
            compopt -o filenames 2>/dev/null
            [[ $1 == file ]] && w=-f || w=-d
            while IFS= read -r dev; do
                COMPREPLY+=("$_ibtool_pre$dev")
            done < <(compgen "$w" -- "$_ibtool_cur")
            ;;
        host)
            while IFS= read -r w; do
                COMPREPLY+=("$_ibtool_pre$w")
            done < <(compgen -A hostname -- "$_ibtool_cur")
            ;;
        dev)
            _ibtool_devices
            _ibtool_add "${_ibtool_r[@]}"
            ;;
        devport)
            if [[ $_ibtool_cur == */* ]]; then
                dev=${_ibtool_cur%%/*}
                _ibtool_ports "$dev"
                for w in "${_ibtool_r[@]}"; do found+=("$dev/$w"); done
                _ibtool_add "${found[@]}"
            else
                _ibtool_devices
                _ibtool_add "${_ibtool_r[@]}"
            fi
            ;;
        port)
            _ibtool_ports ""
            _ibtool_add "${_ibtool_r[@]}"
            ;;
    esac
}

_ibtool() {
    COMPREPLY=()
    local _ibtool_cur=${COMP_WORDS[COMP_CWORD]} _ibtool_pre=
    local -a _ibtool_before=("${COMP_WORDS[@]:1:COMP_CWORD-1}")
    local _ibtool_cmd= _ibtool_root=/ _ibtool_n=0 _ibtool_expect= _ibtool_dd= _ibtool_w
    local _ibtool_name _ibtool_kind _ibtool_block=
    local -a _ibtool_r
    for _ibtool_w in "${_ibtool_before[@]}"; do
        # -p no:NAME (a plugin blocked), which readline splits into -p, no, :, NAME
        case $_ibtool_block in
            p)
                _ibtool_block=
                [[ $_ibtool_w == no:* ]] && continue
                [[ $_ibtool_w == no ]] && _ibtool_block=colon && continue
                ;;
            colon)
                _ibtool_block=
                [[ $_ibtool_w == : ]] && _ibtool_block=name && continue
                ;;
            name) _ibtool_block= && continue ;;
        esac
        if [[ -n $_ibtool_expect ]]; then
            [[ $_ibtool_w == = ]] && continue
            [[ $_ibtool_expect == --root ]] && _ibtool_root=$_ibtool_w
            _ibtool_expect=
            continue
        fi
        if [[ -z $_ibtool_dd && $_ibtool_w == -?* ]]; then
            if [[ $_ibtool_w == -- ]]; then
                _ibtool_dd=1
            elif [[ $_ibtool_w == -p ]]; then
                _ibtool_block=p
            elif [[ $_ibtool_w == --*=* ]]; then
                [[ ${_ibtool_w%%=*} == --root ]] && _ibtool_root=${_ibtool_w#*=}
            elif _ibtool_value "$_ibtool_cmd" "$_ibtool_w"; then
                _ibtool_expect=$_ibtool_w
            fi
        elif [[ -z $_ibtool_cmd ]]; then
            _ibtool_command "$_ibtool_w"
            _ibtool_cmd=${_ibtool_name:-?}
        else
            (( _ibtool_n++ ))
        fi
    done
    [[ $_ibtool_root == '~'/* ]] && _ibtool_root=$HOME/${_ibtool_root#'~'/}
    # --opt=VALUE, split at = by readline (COMP_WORDBREAKS) or not
    if [[ $_ibtool_cur == = && -z $_ibtool_expect ]] && (( COMP_CWORD > 1 )) &&
        _ibtool_value "$_ibtool_cmd" "${COMP_WORDS[COMP_CWORD-1]}"; then
        _ibtool_cur=
        _ibtool_complete "$_ibtool_kind"
        return 0
    fi
    if [[ -n $_ibtool_expect ]]; then
        [[ $_ibtool_cur == = ]] && _ibtool_cur=
        _ibtool_value "$_ibtool_cmd" "$_ibtool_expect"
        _ibtool_complete "$_ibtool_kind"
        return 0
    fi
    if [[ -z $_ibtool_dd && $_ibtool_cur == --*=* ]]; then
        _ibtool_value "$_ibtool_cmd" "${_ibtool_cur%%=*}" || return 0
        _ibtool_pre=${_ibtool_cur%%=*}=
        _ibtool_cur=${_ibtool_cur#*=}
        _ibtool_complete "$_ibtool_kind"
        return 0
    fi
    if [[ -z $_ibtool_dd && $_ibtool_cur == -* ]]; then
        _ibtool_options "$_ibtool_cmd"
        _ibtool_add "${_ibtool_r[@]}"
        return 0
    fi
    if [[ -z $_ibtool_cmd ]]; then
        _ibtool_commands
        _ibtool_add "${_ibtool_r[@]}"
        return 0
    fi
    _ibtool_positional "$_ibtool_cmd" "$_ibtool_n"
    local -a _ibtool_keywords=("${_ibtool_r[@]}")
    _ibtool_add "${_ibtool_keywords[@]}"
    _ibtool_complete "$_ibtool_kind"
    return 0
}

complete -F _ibtool ibtool
